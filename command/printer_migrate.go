package command

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/writerun"
)

// migrateReport is migrate's summary, with the records written (recs nil:
// none were asked for, and the JSON has no "records" member).
type migrateReport struct {
	sum  *migrate.Summary
	recs []storagemigration.Recorded
}

func (m migrateReport) stamped(build buildinfo.Info) any {
	if m.recs == nil {
		return struct {
			Build buildinfo.Info `json:"build"`
			*migrate.Summary
		}{build, m.sum}
	}
	return struct {
		Build buildinfo.Info `json:"build"`
		*migrate.Summary
		Records []storagemigration.Recorded `json:"records"`
	}{build, m.sum, m.recs}
}

func (m migrateReport) table(w io.Writer) error {
	if err := writeSummaryTable(w, m.sum); err != nil {
		return err
	}
	if m.recs == nil {
		return nil
	}
	if len(m.recs) == 0 {
		_, err := fmt.Fprintln(w, "record: no resource was rewritten, so no StorageVersionMigration was written")
		return err
	}
	for _, r := range m.recs {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		line := fmt.Sprintf("record %s (%s): %s", r.Name, gr, r.Result)
		if r.Message != "" {
			line += ": " + r.Message
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// writeSummaryTable is migrate's summary (and plan's decision) as a table
// and its lines.
func writeSummaryTable(w io.Writer, s *migrate.Summary) error {
	verb := "rewritten"
	if s.DryRun {
		verb = "would rewrite"
	}
	for _, line := range s.Preflight {
		fmt.Fprintf(w, "preflight: ok: %s\n", line)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "RESOURCE\tSCANNED\tCURRENT\tSTALE\tREWRITTEN\tCONFLICTS\tUNREADABLE\tFAILED\tWHY\n")
	for _, r := range s.Resources {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", resName(r.Group, r.Resource), r.Scanned, r.Current, r.Stale, r.Rewritten, r.Conflicts, r.Unreadable, r.Failed, reasons(r.Reasons))
	}
	t := s.Summary
	fmt.Fprintf(tw, "TOTAL\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", t.Scanned, t.Current, t.Stale, t.Rewritten, t.Conflicts, t.Unreadable, t.Failed)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, c := range s.CRDs {
		fmt.Fprintf(w, "crd %s: storage version %s, storedVersions %v: %s %s\n", c.Name, c.StorageVersion, c.StoredVersions, c.Action, c.Detail)
	}
	if len(s.FieldLoss) > 0 {
		if err := writeFieldLoss(w, s); err != nil {
			return err
		}
	}
	// One line per cause, not per key: -o json lists the keys.
	for _, c := range s.Causes {
		fmt.Fprintf(w, "%s: %s: %d key(s), the first %s: %s\n", c.Status, c.Cause, c.Count, c.FirstKey, c.Error)
	}
	if s.Space != nil {
		fmt.Fprintln(w, spaceLine(s.Space))
	}
	consistency := "one consistent snapshot"
	switch {
	case !s.Consistent && s.Space != nil && s.Space.Compactions > 0:
		consistency = fmt.Sprintf("revision %d was compacted by --compact-history during the scan, which went on at the newer revision (%d restart(s)); the tool was the only writer", s.Revision, len(s.Restarts))
	case !s.Consistent:
		consistency = fmt.Sprintf("NOT one snapshot: revision %d was compacted during the scan and the scan continued at a newer revision (%d restart(s)); objects written meanwhile were seen at their newer state", s.Revision, len(s.Restarts))
	}
	n := t.Rewritten
	if s.DryRun {
		n = t.Stale
	}
	fmt.Fprintf(w, "%s %d of %d objects in %s at revision %d (%s); %d skipped (%d unreadable, never written)\n",
		verb, n, t.Scanned, s.DurationText, s.Revision, consistency, t.Skipped, t.Unreadable)
	if t.Orphaned > 0 {
		fmt.Fprintf(w, "%d orphaned key(s) left untouched: no built-in resource or CRD of this cluster owns them and kube-apiserver never reads them ('verify' lists them, 'quarantine --reason orphaned' removes them, journaled)\n", t.Orphaned)
	}
	if s.Interrupted {
		fmt.Fprintln(w, "interrupted: run the same command again to continue; current objects are skipped")
	}
	return nil
}

// writeFieldLoss is the summary's field loss: which fields of which custom
// resources the rewrite drops (paths and counts, never values), and where
// the objects' originals are.
func writeFieldLoss(w io.Writer, s *migrate.Summary) error {
	if err := writeFieldLossTable(w, s.FieldLoss, !s.DryRun); err != nil {
		return err
	}
	var n int64
	for _, f := range s.FieldLoss {
		n += f.Objects
	}
	var err error
	switch {
	case s.DryRun:
		_, err = fmt.Fprintf(w, "field loss: migrate would rewrite %d object(s) without these fields; its journal keeps each one's original value (rollback puts it back)\n", n)
	case s.Journal != "":
		_, err = fmt.Fprintf(w, "field loss: %d object(s) rewritten without these fields; their original values, fields included, are in the journal %s (each key's intent record, oldValue; 'rollback --journal %s' puts them back)\n", n, s.Journal, s.Journal)
	default:
		_, err = fmt.Fprintf(w, "field loss: %d object(s) rewritten without these fields, and no journal was kept (--no-undo): only a backup holds their original values\n", n)
	}
	return err
}

// spaceLine is what a run saw of etcd's database.
func spaceLine(sp *writerun.SpaceReport) string {
	line := fmt.Sprintf("etcd database: %s before, %s after (at most %s during the run; quota %s)", textfmt.Bytes(sp.DBSizeBefore), textfmt.Bytes(sp.DBSizeAfter), textfmt.Bytes(sp.DBSizeMax), textfmt.Bytes(sp.Quota.Bytes))
	if sp.Compactions > 0 {
		line += fmt.Sprintf("; --compact-history compacted %d time(s), last at revision %d", sp.Compactions, sp.CompactedAt)
		if sp.LastGoesOn {
			line += " (etcd still removes its old revisions, in the background as it does kube-apiserver's: nothing to wait for)"
		}
	}
	return line
}

// rollbackReport is what rollback restored.
type rollbackReport struct{ res rollback.RollbackResult }

func (r rollbackReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		rollback.RollbackResult
	}{build, r.res}
}

func (r rollbackReport) table(w io.Writer) error {
	res := r.res
	for _, p := range res.Preflight {
		fmt.Fprintf(w, "preflight: %s\n", p)
	}
	verb := "restored"
	if res.DryRun {
		verb = "dry run, nothing written: would restore"
	}
	fmt.Fprintf(w, "%s %d, unchanged %d, skipped %d (changed since), failed %d\n", verb, res.Restored, res.Unchanged, res.Skipped, res.Failed)
	for _, c := range res.Causes {
		fmt.Fprintf(w, "%s: %s: %d key(s), the first %s\n", c.Status, c.Cause, c.Count, c.FirstKey)
	}
	for _, k := range res.Keys {
		fmt.Fprintf(w, "  %s\n", k)
	}
	if res.KeysNotListed > 0 {
		fmt.Fprintf(w, "  ... and %d more\n", res.KeysNotListed)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	if res.Space != nil {
		fmt.Fprintln(w, spaceLine(res.Space))
	}
	return nil
}

func resName(group, resource string) string {
	if group == "" {
		return resource
	}
	return resource + "." + group
}

func reasons(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ",")
}
