package command

import (
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

func cmdInventory(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	s, err := open(ctx, c, targetNone)
	if err != nil {
		return err
	}
	defer s.close()
	prog := newProgress(c.App.ErrWriter, "inventory", countKeys(ctx, s.env))
	inv, err := inventory.Run(ctx, s.env, inventory.Options{}, prog.Set)
	prog.Finish()
	if err != nil {
		return err
	}
	return printReport(c.App.Writer, c.String("output"), inventoryReport{inv})
}
