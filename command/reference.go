package command

import (
	"io"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// Reference is the command line as data, for what documents it outside the
// binary from the same definitions --help prints: the man page, the shell
// completion files the packages install and docs/commands.md's flag tables.
// internal/build/docgen renders them (`make docs`) and its test fails when the
// checked-in files differ from what it renders; nothing here renders.
type Reference struct {
	// Name is the program's name.
	Name string
	// Commands are the commands in --help's order, each with its flags.
	Commands []CommandRef
	// Environment is the ENVIRONMENT section of --help, without its heading,
	// as --help prints it.
	Environment string
	// ExitCodes are exitCodes' rows, in order.
	ExitCodes []ExitCode
	// Completion is each shell's completion script (completion bash|zsh).
	Completion map[string]string
	// StateDir is --state-dir's default.
	StateDir string
}

// CommandRef is one command: its name, what --help says of it, and its flags.
type CommandRef struct {
	Name, Usage, ArgsUsage string
	Flags                  []FlagRef
}

// FlagRef is one flag as --help shows it.
type FlagRef struct {
	Names   []string // the name, then its aliases
	Usage   string
	Default string // the default --help prints, unquoted ("" when none is shown)
	EnvVars []string
	// TakesValue is false for a bool flag.
	TakesValue bool
}

// ExitCode is one row of the exit-code table.
type ExitCode struct {
	Code     int
	Commands []string // the commands it applies to; all of them when Every
	Every    bool
	Meaning  string
}

// NewReference returns the command line's reference.
func NewReference() Reference {
	app := newApp(io.Discard, io.Discard)
	ref := Reference{
		Name:        app.Name,
		Environment: strings.TrimPrefix(environmentHelpTx, "ENVIRONMENT:\n"),
		Completion:  map[string]string{},
		StateDir:    flagRef(stateDirFlag()).Default,
	}
	for _, c := range app.Commands {
		cr := CommandRef{Name: c.Name, Usage: c.Usage, ArgsUsage: c.ArgsUsage}
		for _, f := range c.Flags {
			cr.Flags = append(cr.Flags, flagRef(f))
		}
		ref.Commands = append(ref.Commands, cr)
	}
	for _, r := range exitCodes {
		every := len(r.Commands) == len(everyCmd)
		ref.ExitCodes = append(ref.ExitCodes, ExitCode{Code: r.Code, Commands: append([]string(nil), r.Commands...), Every: every, Meaning: r.Meaning})
	}
	for shell, script := range completionScripts {
		ref.Completion[shell] = strings.ReplaceAll(script, "PROG", app.Name)
	}
	return ref
}

// flagRef describes a flag as --help shows it.
func flagRef(f cli.Flag) FlagRef {
	ref := FlagRef{Names: f.Names()}
	if df, ok := f.(cli.DocGenerationFlag); ok {
		ref.Usage, ref.EnvVars, ref.TakesValue = df.GetUsage(), df.GetEnvVars(), df.TakesValue()
		if ref.TakesValue {
			ref.Default = df.GetDefaultText()
			if u, err := strconv.Unquote(ref.Default); err == nil {
				ref.Default = u
			}
		}
	}
	return ref
}
