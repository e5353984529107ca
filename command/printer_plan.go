package command

import (
	"errors"
	"fmt"
	"io"
	"time"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/plan"
	"kube-etcd-migrate/writerun"
)

// planReport is the plan: the checks, the decision (migrate's summary of a
// dry run), the estimate, and each blocker with its remedy.
type planReport struct{ plan *plan.Plan }

func (pr planReport) stamped(build buildinfo.Info) any {
	p := *pr.plan
	if pr.plan.Blockers != nil {
		p.Blockers = make([]plan.Blocker, len(pr.plan.Blockers))
		for i, b := range pr.plan.Blockers {
			b.Remedy = remedy(b)
			p.Blockers[i] = b
		}
	}
	return struct {
		Build buildinfo.Info `json:"build"`
		*plan.Plan
	}{build, &p}
}

// remedy is a blocker's fix in words, naming the flags that apply.
func remedy(b plan.Blocker) string {
	switch b.Fix {
	case plan.FixMember:
		return "bring the member back (its etcd static pod and data directory on that node), or remove it ('etcdctl member remove ID') if it is gone for good"
	case plan.FixMemberErrors:
		return "resolve what the member reports (etcdctl endpoint status) before the window"
	case plan.FixQuorum:
		return "restore etcd's quorum first (etcdctl endpoint status --cluster)"
	case plan.FixAlarm:
		return "for NOSPACE: compact, defragment every member, then 'etcdctl alarm disarm'"
	case plan.FixConversionWebhook:
		return "with every kube-apiserver stopped the webhook's Service is reached through its ready endpoints in etcd (its pods keep answering during the outage); if none answers from here, give one with --conversion-webhook NAMESPACE/SERVICE=HOST:PORT"
	case plan.FixQuota:
		return "compact and defragment etcd before the window, or rerun the plan with --compact-history (migrate then compacts as it goes), or raise --quota-backend-bytes"
	case plan.FixStateDir:
		return "chmod 700 it (it holds stored values), or wait for the run that holds it; --state-dir names another"
	case plan.FixDiskSpace:
		// (A filesystem that lacks room whatever the undo: etcd's own.)
		var room interface{ UndoNeeds() bool }
		if errors.As(b.Cause, &room) && !room.UndoNeeds() {
			return "free room on that filesystem: etcd's own database and WAL need it, whatever the undo (another --state-dir does not help)"
		}
		return "free room on that filesystem, or give --state-dir on another one (the undo needs the room; --no-undo is not a remedy)"
	case plan.FixEncryption:
		return "start the KMS plugin (its socket must answer on this node) or fix the key in the encryption configuration"
	}
	return b.Remedy
}

// webhookLine says whether a CRD's conversion webhook answered from here.
func webhookLine(wh plan.WebhookCheck) string {
	target := wh.Target
	if wh.Given != "" {
		target += " at " + wh.Given + " (--conversion-webhook)"
	}
	name := fmt.Sprintf("conversion webhook of %s (%s)", wh.CRD, target)
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

func (pr planReport) table(w io.Writer) error {
	p := pr.plan
	for _, l := range p.Checks {
		fmt.Fprintf(w, "ok: %s\n", l)
	}
	if u := p.Undo; u != nil {
		fmt.Fprintln(w, undoLine(*u))
	}
	for _, wh := range p.Webhooks {
		fmt.Fprintln(w, webhookLine(wh))
	}
	decided := time.Duration(p.Estimate.DecideSeconds * float64(time.Second)).Round(time.Millisecond)
	if err := writeSummaryTable(w, &migrate.Summary{DryRun: true, Revision: p.Revision, Summary: p.Summary, Resources: p.Resources, Causes: p.Causes, CRDs: p.CRDs, FieldLoss: p.FieldLoss, Consistent: p.Consistent, DurationText: decided.String()}); err != nil {
		return err
	}
	writeEstimate(w, p.Estimate)
	for _, b := range p.Blockers {
		fmt.Fprintf(w, "BLOCKER (%s): %s; remedy: %s\n", b.Check, b.Problem, remedy(b))
	}
	if p.Proceeds() {
		fmt.Fprintln(w, "migrate would proceed: stop every kube-apiserver, then run migrate with the same flags")
	}
	return nil
}

// writeEstimate is the estimate: its range, then a line per part.
func writeEstimate(w io.Writer, e plan.Estimate) {
	fmt.Fprintf(w, "estimate: migrate takes %s on this machine, from its start to its exit (%s); kube-apiserver's stop and start come on top\n", fmtRange(e.Low, e.High), e.Basis)
	for _, p := range e.Parts {
		fmt.Fprintf(w, "  %-21s %s: %s\n", p.Name, fmtRange(p.Low, p.High), p.Basis)
	}
	switch ws, c := e.Writes, e.Etcd; {
	case ws != nil && ws.Error != "":
		fmt.Fprintf(w, "  (the writes timed on plan's copy of the SQLite datastore stopped short: %s; their costs assumed)\n", ws.Error)
	case ws != nil:
		// Timed on the SQLite datastore's copy: etcd's metrics not needed.
	case c != nil && c.Error != "":
		fmt.Fprintf(w, "  (etcd's metrics: %s)\n", c.Error)
	}
}

// fmtRange is a range of seconds, in seconds or minutes.
func fmtRange(low, high float64) string {
	if high < 90 {
		return fmt.Sprintf("%.1f–%.1f s", low, high)
	}
	return fmt.Sprintf("%.1f–%.1f min", low/60, high/60)
}

// undoLine says whether a rollback of the run fits below etcd's quota after
// the rewrite: a warning, naming the flag, when it will need compaction.
func undoLine(u writerun.UndoFit) string {
	if !u.NeedsCompaction {
		return fmt.Sprintf("ok: the undo: a rollback of this run writes about %s back, which fits in the %s left below the quota after the rewrite", textfmt.Bytes(u.RollbackBytes), textfmt.Bytes(u.RoomAfter))
	}
	return fmt.Sprintf("warning: the undo: a rollback of this run writes about %s back, more than the %s left below the quota after the rewrite: run it as rollback %s (it compacts etcd's history as it goes, as migrate does)",
		textfmt.Bytes(u.RollbackBytes), textfmt.Bytes(u.RoomAfter), flagOf(input.CompactHistory))
}
