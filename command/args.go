package command

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// interspersed lets flags appear anywhere on the command line, as etcdctl and
// kubectl accept them: urfave/cli v2 (like Go's flag package) stops parsing flags
// at the first positional argument, and has no option to go on (urfave/cli#976,
// #1177; only v3 parses flags anywhere). So before the app parses them, args are
// reordered to "PROG [app flags] COMMAND [command flags] -- [arguments]" using
// the command's own flag definitions: which names exist, which take a value
// ("--flag value" and "-o value" consume the next word, "--flag=value" does not,
// bool flags never do). A "--" ends the flags: every word after it is an
// argument. Flags of a command given before the command name ("--endpoints X
// inventory", etcdctl's global-flag habit) are carried after it.
//
// Words that are not flags of the command are left where the parser reports
// them ("flag provided but not defined"), and shell completion requests (which
// end in --generate-bash-completion and are read from os.Args) are not touched.
func interspersed(app *cli.App, args []string) []string {
	if len(args) < 2 || args[len(args)-1] == "--generate-bash-completion" {
		return args
	}
	app.Setup() // adds the help and version flags; Run does not set up twice
	appFlags := flagIndex(app.Flags)
	anyCommand := flagIndex(nil)
	for _, c := range app.Commands {
		for name, takes := range flagIndex(c.Flags) {
			anyCommand[name] = anyCommand[name] || takes
		}
	}

	out := []string{args[0]}
	var carried []string
	i := 1
	for ; i < len(args); i++ {
		a := args[i]
		if a == "--" || !isFlagWord(a) {
			break
		}
		name, inline := flagName(a)
		if takes, ok := appFlags[name]; ok {
			out = append(out, a)
			if takes && !inline && i+1 < len(args) {
				i++
				out = append(out, args[i])
			}
			continue
		}
		takes, ok := anyCommand[name]
		if !ok {
			return args // unknown everywhere: let the app say so
		}
		carried = append(carried, a)
		if takes && !inline && i+1 < len(args) {
			i++
			carried = append(carried, args[i])
		}
	}
	if i == len(args) || args[i] == "--" {
		return args
	}
	cmd := app.Command(args[i])
	if cmd == nil || len(cmd.Subcommands) > 0 || cmd.SkipFlagParsing {
		return args
	}
	out = append(out, args[i])
	out = append(out, carried...)

	known := flagIndex(cmd.Flags)
	if cli.HelpFlag != nil && !cmd.HideHelp {
		for _, n := range cli.HelpFlag.Names() {
			known[n] = false
		}
	}
	var positional []string
	for j := i + 1; j < len(args); j++ {
		a := args[j]
		if a == "--" {
			positional = append(positional, args[j+1:]...)
			break
		}
		if !isFlagWord(a) {
			positional = append(positional, a)
			continue
		}
		out = append(out, a)
		name, inline := flagName(a)
		if known[name] && !inline {
			if j+1 == len(args) {
				// No value: the parser's "flag needs an argument" is the error to
				// give, and the arguments do not matter any more.
				return out
			}
			j++
			out = append(out, args[j])
		}
	}
	if len(positional) > 0 {
		out = append(out, "--")
		out = append(out, positional...)
	}
	return out
}

// flagIndex maps every name and alias of flags to whether it takes a value.
func flagIndex(flags []cli.Flag) map[string]bool {
	m := map[string]bool{}
	for _, f := range flags {
		takes := true
		if d, ok := f.(cli.DocGenerationFlag); ok {
			takes = d.TakesValue()
		}
		for _, n := range f.Names() {
			m[n] = takes
		}
	}
	return m
}

// isFlagWord: "-x", "--name", "--name=value"; a lone "-" is an argument.
func isFlagWord(a string) bool {
	return len(a) > 1 && a[0] == '-' && a != "--"
}

// flagName returns the name of a flag word and whether its value is inline.
func flagName(a string) (name string, inline bool) {
	name = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
	name, _, inline = strings.Cut(name, "=")
	return name, inline
}
