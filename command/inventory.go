package command

import (
	"context"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/inventory"
)

func inventoryCommand() *cli.Command {
	return &cli.Command{
		Name:         "inventory",
		Usage:        "census per resource: count, bytes, stored versions, media types, encryption, leases, unreadable",
		Flags:        append(commonFlags(), outputFlag("table", "table", "json"), revisionFlag()),
		Action:       cmdInventory,
		OnUsageError: commandUsageError,
	}
}

// inventoryOptions are inventory's flags.
type inventoryOptions struct {
	scan   *scanOptions
	output string
}

func cmdInventory(c *cli.Context) error {
	o := &inventoryOptions{scan: newScanOptions(c, targetNone), output: c.String("output")}
	if err := o.scan.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	return o.runInventory(ctx)
}

// runInventory is the inventory command, its options validated.
func (o *inventoryOptions) runInventory(ctx context.Context) error {
	s, err := open(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	prog := newProgress(o.scan.io.errOut, "inventory", countKeys(ctx, s.env))
	inv, err := inventory.Run(ctx, s.env, inventory.Options{}, prog.Set)
	prog.Finish()
	if err != nil {
		return err
	}
	return printReport(o.scan.io.out, o.output, inventoryReport{inv})
}
