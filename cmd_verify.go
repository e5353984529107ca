package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/verify"
)

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:               "verify",
		Usage:              "read-only audit: what is current, stale or unreadable for the target release",
		Flags:              append(append(commonFlags(), targetFlags()...), outputFlag("table", "table", "json", "yaml"), &cli.IntFlag{Name: "show-keys", Value: 5, Usage: "list the first N keys of each class per resource"}, &cli.StringFlag{Name: "metrics-file", Usage: "write Prometheus text-format metrics here (node_exporter textfile collector)"}, revisionFlag()),
		Action:             cmdVerify,
		OnUsageError:       commandUsageError,
		CustomHelpTemplate: cli.CommandHelpTemplate + "\n" + exitCodesHelpTx + "\n",
	}
}

func cmdVerify(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	s, err := open(ctx, c, true)
	if err != nil {
		return err
	}
	defer s.close()
	rep, err := verify.Run(ctx, s.env, verify.Options{ShowKeys: c.Int("show-keys")})
	if err != nil {
		return err
	}
	plan, err := storagemigration.PlanRequests(ctx, s.env, rep)
	if err != nil {
		return err
	}
	if err := writeReport(c.App.Writer, c.String("output"), verifyWithRequests(rep, plan)); err != nil {
		return err
	}
	if p := c.String("metrics-file"); p != "" {
		if err := metrics.WriteVerify(p, rep); err != nil {
			return fmt.Errorf("--metrics-file %s: %w", p, err)
		}
	}
	if code := rep.ExitCode(); code != 0 {
		return &codeError{code: code, err: fmt.Errorf("exit %d", code)}
	}
	return nil
}
