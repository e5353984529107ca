package command

import (
	"context"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/inventory"
)

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name:         "inspect",
		Usage:        "decode one key and show it with its storage header (Secret and ConfigMap data redacted)",
		ArgsUsage:    "KEY",
		Flags:        append(commonFlags(), outputFlag("yaml", "yaml", "json"), &cli.BoolFlag{Name: "show-secrets", Usage: "print Secret and ConfigMap data instead of redacting it"}, revisionFlag()),
		Action:       cmdInspect,
		OnUsageError: commandUsageError,
	}
}

// inspectOptions are inspect's flags and its KEY.
type inspectOptions struct {
	scan        *scanOptions
	output      string
	showSecrets bool
	args        []string
}

func newInspectOptions(c *cli.Context) *inspectOptions {
	return &inspectOptions{scan: newScanOptions(c, targetNone), output: c.String("output"), showSecrets: c.Bool("show-secrets"), args: c.Args().Slice()}
}

// validate refuses, before anything is opened, what inspect's flags and
// arguments alone refuse.
func (o *inspectOptions) validate() error {
	if len(o.args) != 1 {
		return usageErr("inspect takes exactly one KEY, e.g. /registry/secrets/default/my-secret")
	}
	return o.scan.validate()
}

func cmdInspect(c *cli.Context) error {
	o := newInspectOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	return o.runInspect(ctx)
}

// runInspect is the inspect command, its options validated.
func (o *inspectOptions) runInspect(ctx context.Context) error {
	s, err := open(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	obj, err := inventory.Inspect(ctx, s.env, o.args[0], o.showSecrets)
	if obj != nil {
		// A key that does not decode: its header and the reason, then the error.
		if werr := writeInspected(o.scan.io.out, obj, o.output); werr != nil {
			return werr
		}
	}
	return err
}
