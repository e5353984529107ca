package command

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/plan"
)

func planCommand() *cli.Command {
	return &cli.Command{
		Name:  "plan",
		Usage: "read-only, kube-apiserver still up: everything migrate (with the same flags) would check before its first write except liveness, one line per blocker with its remedy, and an estimate of the outage",
		// The migrate command's flags, so that the plan is the same command
		// line with another verb.
		Flags:        migrateCommand().Flags,
		Action:       cmdPlan,
		OnUsageError: commandUsageError,
	}
}

func cmdPlan(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	for _, f := range []string{"requested", "record", "snapshot-file", "output-snapshot"} {
		if c.IsSet(f) {
			return usageErr("--%s: plan is for a migrate of the cluster's etcd (see docs/commands.md#plan)", f)
		}
	}
	s, window, err := openToWrite(ctx, c, targetWrite)
	if err != nil {
		return err
	}
	defer s.close()
	stateDir := c.String("state-dir")
	if c.Bool("no-undo") {
		stateDir = ""
	}
	p, err := plan.Run(ctx, s.env, plan.Options{Migrate: migrateOptions(c, ctx, nil, window), StateDir: stateDir})
	if err != nil {
		return err
	}
	for i, b := range p.Blockers {
		if b.Cause != nil {
			p.Blockers[i].Problem = cliMessage(b.Cause)
		}
	}
	if err := writeReport(c.App.Writer, c.String("output"), func(w io.Writer, format string) error {
		if format == "json" {
			return writeJSON(w, p)
		}
		return writePlan(w, p)
	}); err != nil {
		return err
	}
	if !p.Proceeds() {
		problems := make([]string, len(p.Blockers))
		for i, b := range p.Blockers {
			problems[i] = b.Check
		}
		return &codeError{code: exitError, err: fmt.Errorf("migrate would refuse: %d blocker(s) (%s); each is listed above with its remedy", len(p.Blockers), strings.Join(problems, ", "))}
	}
	if p.Summary.Unreadable > 0 {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s): migrate would leave them untouched and exit 4", p.Summary.Unreadable)}
	}
	return nil
}

// webhookLine says whether a CRD's conversion webhook answered from here.
func webhookLine(wh plan.WebhookCheck) string {
	name := fmt.Sprintf("conversion webhook of %s (%s)", wh.CRD, wh.Target)
	if wh.Target == "" {
		name = "conversion webhook of " + wh.CRD
	}
	switch {
	case wh.Answered && wh.Conversions > 0 && wh.Failures > 0:
		return fmt.Sprintf("warning: %s answered at %s: %d object(s) converted, %d failed (a blocker below): %s", name, wh.Address, wh.Conversions, wh.Failures, wh.Error)
	case wh.Answered && wh.Conversions > 0:
		return fmt.Sprintf("ok: %s answered at %s: %d object(s) converted", name, wh.Address, wh.Conversions)
	case wh.Answered:
		return fmt.Sprintf("ok: %s answered at %s (TLS handshake verified; no stored object needs converting)", name, wh.Address)
	case wh.Failures > 0:
		return fmt.Sprintf("warning: %s did not answer: %d conversion(s) failed (a blocker below): %s", name, wh.Failures, wh.Error)
	default:
		return fmt.Sprintf("warning: %s does not answer from here: %s (no stored object needs converting, so migrate will not call it; kube-apiserver will)", name, wh.Error)
	}
}

func writePlan(w io.Writer, p *plan.Plan) error {
	for _, l := range p.Checks {
		fmt.Fprintf(w, "ok: %s\n", l)
	}
	for _, wh := range p.Webhooks {
		fmt.Fprintln(w, webhookLine(wh))
	}
	decided := time.Duration(p.Estimate.DecideSeconds * float64(time.Second)).Round(time.Millisecond)
	if err := writeSummary(w, &migrate.Summary{DryRun: true, Revision: p.Revision, Summary: p.Summary, Resources: p.Resources, Causes: p.Causes, CRDs: p.CRDs, FieldLoss: p.FieldLoss, Consistent: p.Consistent, DurationText: decided.String()}, "table"); err != nil {
		return err
	}
	fmt.Fprintf(w, "estimate: migrate takes about %s on this machine (%s)\n", fmtSeconds(p.Estimate.Seconds), p.Estimate.Basis)
	for _, b := range p.Blockers {
		fmt.Fprintf(w, "BLOCKER (%s): %s; remedy: %s\n", b.Check, b.Problem, b.Remedy)
	}
	if p.Proceeds() {
		fmt.Fprintln(w, "migrate would proceed: stop every kube-apiserver, then run migrate with the same flags")
	}
	return nil
}

func fmtSeconds(s float64) string {
	if s < 90 {
		return fmt.Sprintf("%.0f s", s+0.5)
	}
	return fmt.Sprintf("%.1f min", s/60)
}
