package command

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/migrate"
)

func rollbackCommand() *cli.Command {
	return &cli.Command{
		Name:  "rollback",
		Usage: "put back the values a migrate run replaced, from its journal (keys changed since are skipped)",
		Flags: append(append(etcdscan.Flags(), apiServerFlags()...),
			&cli.StringFlag{Name: "journal", Required: true, Usage: "journal written by 'migrate --journal'"},
			outputFlag("table", "table", "json")),
		Action:       cmdRollback,
		OnUsageError: commandUsageError,
	}
}

func cmdRollback(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	cli, err := connect(ctx, c)
	if err != nil {
		return err
	}
	defer cli.Close()
	res, err := migrate.Rollback(ctx, cli, c.String("journal"), &etcdscan.Writer{Client: cli})
	if werr := writeRollback(c.App.Writer, res, c.String("output")); werr != nil && err == nil {
		err = werr
	}
	if err != nil {
		return err
	}
	if res.Failed > 0 {
		return &codeError{code: exitError, err: fmt.Errorf("%d key(s) could not be restored", res.Failed)}
	}
	return nil
}
