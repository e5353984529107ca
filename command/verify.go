package command

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/verify"
)

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:         "verify",
		Usage:        "read-only audit: what is current, stale or unreadable for the target release",
		Flags:        append(append(verifyFlags(), targetFlags()...), outputFlag("table", "table", "json", "yaml"), &cli.IntFlag{Name: "show-keys", Value: 5, Usage: "list the first N keys of each class per resource"}, &cli.BoolFlag{Name: "fail-on-orphaned", Usage: "strict audit: exit 4 when a key no built-in resource or CRD owns is found (orphaned keys are reported but do not fail the gate otherwise)"}, &cli.StringFlag{Name: "metrics-file", Usage: "write Prometheus text-format metrics here (node_exporter textfile collector)"}, revisionFlag()),
		Action:       cmdVerify,
		OnUsageError: commandUsageError,
	}
}

func cmdVerify(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	targets, several, err := snapshotTargets(c)
	if err != nil {
		return err
	}
	if several {
		return verifySnapshotFiles(ctx, c, targets)
	}
	s, err := open(ctx, c, targetJudge)
	if err != nil {
		return err
	}
	defer s.close()
	rep, err := verify.Run(ctx, s.env, verify.Options{ShowKeys: c.Int("show-keys"), FailOnOrphaned: c.Bool("fail-on-orphaned")})
	if err != nil {
		return err
	}
	plan, err := storagemigration.PlanRequests(ctx, s.env, rep)
	if err != nil {
		return err
	}
	if err := printReport(c.App.Writer, c.String("output"), verifyReport{rep, plan}); err != nil {
		return err
	}
	if p := c.String("metrics-file"); p != "" {
		if err := metrics.WriteVerify(p, rep); err != nil {
			return fmt.Errorf("--metrics-file %s: %w", p, err)
		}
	}
	switch code := rep.ExitCode(); code {
	case exitOK:
		return nil
	case exitStale, exitUnreadable:
		return &codeError{code: code, err: fmt.Errorf("exit %d", code), quiet: true}
	default:
		return fmt.Errorf("verify: exit code %d is none of those documented (exitCodes)", code)
	}
}
