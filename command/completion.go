package command

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"
)

// Shell completion is urfave/cli's: with EnableBashCompletion the binary answers
// "... --generate-bash-completion" with the commands or flags that fit, and these
// scripts (urfave/cli v2.27's autocomplete/bash_autocomplete and zsh_autocomplete,
// MIT licence, which its documentation asks applications to ship) call it. The
// library does not embed them in v2, so `completion` prints them with the program
// name filled in.
const (
	bashCompletion = `# bash completion for PROG (urfave/cli's bash_autocomplete); needs the bash-completion package.
# Load it with: source <(PROG completion bash)

# Macs have bash3 for which the bash-completion package doesn't include
# _init_completion. This is a minimal version of that function.
_cli_init_completion() {
  COMPREPLY=()
  _get_comp_words_by_ref "$@" cur prev words cword
}

_cli_bash_autocomplete() {
  if [[ "${COMP_WORDS[0]}" != "source" ]]; then
    local cur opts base words
    COMPREPLY=()
    cur="${COMP_WORDS[COMP_CWORD]}"
    if declare -F _init_completion >/dev/null 2>&1; then
      _init_completion -n "=:" || return
    else
      _cli_init_completion -n "=:" || return
    fi
    words=("${words[@]:0:$cword}")
    if [[ "$cur" == "-"* ]]; then
      requestComp="${words[*]} ${cur} --generate-bash-completion"
    else
      requestComp="${words[*]} --generate-bash-completion"
    fi
    opts=$(eval "${requestComp}" 2>/dev/null)
    COMPREPLY=($(compgen -W "${opts}" -- ${cur}))
    return 0
  fi
}

complete -o bashdefault -o default -o nospace -F _cli_bash_autocomplete PROG
`
	zshCompletion = `#compdef PROG
# zsh completion for PROG (urfave/cli's zsh_autocomplete).
# Load it with: source <(PROG completion zsh)   (after compinit)

_cli_zsh_autocomplete() {
  local -a opts
  local cur
  cur=${words[-1]}
  if [[ "$cur" == "-"* ]]; then
    opts=("${(@f)$(${words[@]:0:#words[@]-1} ${cur} --generate-bash-completion)}")
  else
    opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion)}")
  fi

  if [[ "${opts[1]}" != "" ]]; then
    _describe 'values' opts
  else
    _files
  fi
}

compdef _cli_zsh_autocomplete PROG
`
)

var completionScripts = map[string]string{"bash": bashCompletion, "zsh": zshCompletion}

func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print the shell completion script: source <(kube-etcd-migrate completion bash)",
		ArgsUsage: "bash|zsh",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usageErr("completion takes one shell: bash or zsh")
			}
			script, ok := completionScripts[c.Args().First()]
			if !ok {
				return usageErr("completion %q: want bash or zsh", c.Args().First())
			}
			_, err := fmt.Fprint(c.App.Writer, strings.ReplaceAll(script, "PROG", c.App.Name))
			return err
		},
		BashComplete: func(c *cli.Context) {
			if c.NArg() == 0 {
				fmt.Fprintln(c.App.Writer, "bash\nzsh")
			}
		},
		OnUsageError: commandUsageError,
	}
}
