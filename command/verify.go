package command

import (
	"context"
	"fmt"
	"os"

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

// verifyOptions are verify's flags.
type verifyOptions struct {
	scan           *scanOptions
	output         string
	showKeys       int
	failOnOrphaned bool
	metricsFile    string
	// files are --snapshot-file's paths; several says they are more than
	// one, or a directory (validate).
	files   []string
	several bool
}

func newVerifyOptions(c *cli.Context) *verifyOptions {
	o := &verifyOptions{
		scan:           newScanOptions(c, targetJudge),
		output:         c.String("output"),
		showKeys:       c.Int("show-keys"),
		failOnOrphaned: c.Bool("fail-on-orphaned"),
		metricsFile:    c.String("metrics-file"),
	}
	if l, _ := c.Generic("snapshot-file").(*snapshotFileList); l != nil {
		o.files = l.paths
	}
	return o
}

// validate refuses, before anything is opened, what verify's flags alone
// refuse (whether --snapshot-file names several files is a look at its
// path: a directory is several).
func (o *verifyOptions) validate() error {
	o.several = len(o.files) > 1
	if len(o.files) == 1 {
		fi, err := os.Stat(o.files[0])
		o.several = err == nil && fi.IsDir()
	}
	if o.several {
		if o.scan.revisionFlag && o.scan.revisionSet {
			return usageErr("--revision with several --snapshot-file: each file is read at its own revision; give one file")
		}
		if o.metricsFile != "" {
			return usageErr("--metrics-file with several --snapshot-file: the metrics are one report's; give one file")
		}
	}
	return o.scan.validate()
}

func cmdVerify(c *cli.Context) error {
	o := newVerifyOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	if o.several {
		return o.runVerifyFiles(ctx)
	}
	return o.runVerify(ctx)
}

// runVerify is the verify command of etcd or one snapshot file, its options validated.
func (o *verifyOptions) runVerify(ctx context.Context) error {
	es, err := o.scan.clusterEtcds(o.scan.io.errOut)
	if err != nil {
		return err
	}
	if es.Split() {
		return o.runVerifyEtcds(ctx, es)
	}
	s, err := open(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	rep, err := verify.Run(ctx, s.env, verify.Options{ShowKeys: o.showKeys, FailOnOrphaned: o.failOnOrphaned})
	if err != nil {
		return err
	}
	plan, err := storagemigration.PlanRequests(ctx, s.env, rep)
	if err != nil {
		return err
	}
	if err := printReport(o.scan.io.out, o.output, verifyReport{rep, plan}); err != nil {
		return err
	}
	if p := o.metricsFile; p != "" {
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
