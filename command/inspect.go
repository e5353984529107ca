package command

import (
	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/inventory"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:         "inspect",
		Usage:        "decode one key and show it with its storage header (secrets redacted)",
		ArgsUsage:    "KEY",
		Flags:        append(commonFlags(), outputFlag("yaml", "yaml", "json"), &cli.BoolFlag{Name: "show-secrets", Usage: "print Secret data instead of redacting it"}, revisionFlag()),
		Action:       cmdInspect,
		OnUsageError: commandUsageError,
	}
}

func cmdInspect(c *cli.Context) error {
	if c.NArg() != 1 {
		return usageErr("inspect takes exactly one KEY, e.g. /registry/secrets/default/my-secret")
	}
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	s, err := open(ctx, c, targetNone)
	if err != nil {
		return err
	}
	defer s.close()
	o, err := inventory.Inspect(ctx, s.env, c.Args().First(), c.Bool("show-secrets"))
	if o != nil {
		// A key that does not decode: its header and the reason, then the error.
		if werr := writeInspected(c.App.Writer, o, c.String("output")); werr != nil {
			return werr
		}
	}
	return err
}
