package command

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/verify"
)

// verifyReport is verify's report, with the pending StorageVersionMigration
// requests (nil: etcd holds none) after it: a table of its own, a
// "storageVersionMigrations" member in JSON and YAML.
type verifyReport struct {
	rep      *verify.Report
	requests *storagemigration.Plan
}

func (v verifyReport) table(w io.Writer) error {
	if err := writeVerifyTable(w, v.rep); err != nil {
		return err
	}
	if v.requests == nil {
		return nil
	}
	return writeRequestsTable(w, v.requests)
}

func (v verifyReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*verify.Report
		Requests *storagemigration.Plan `json:"storageVersionMigrations,omitempty"`
	}{build, verifyValue(v.rep), requestsValue(v.requests)}
}

// verifyValue is the report as JSON shows it: the lists that are empty as []
// rather than null, no orphaned groups when none was counted, and every CRD's
// note in words.
func verifyValue(r *verify.Report) *verify.Report {
	c := *r
	if c.Resources == nil {
		c.Resources = []verify.ResourceReport{}
	}
	c.CRDs = withCRDNotes(c.CRDs)
	if c.CRDs == nil {
		c.CRDs = []verify.CRDStatus{}
	}
	if c.Prefixes == nil {
		c.Prefixes = []string{}
	}
	if c.Summary.Orphaned == 0 {
		c.Orphaned = nil
	}
	return &c
}

// withCRDNotes is a copy of crds with each note in words (crdNote).
func withCRDNotes(crds []verify.CRDStatus) []verify.CRDStatus {
	if crds == nil {
		return nil
	}
	out := make([]verify.CRDStatus, len(crds))
	for i, c := range crds {
		c.Note = crdNote(c)
		out[i] = c
	}
	return out
}

// crdNote explains a CRD's storedVersions verdict in one sentence: the
// report's own, or, for a CRD the run's filters left unjudged, which flag
// left it out.
func crdNote(c verify.CRDStatus) string {
	switch c.Unjudged {
	case verify.NarrowedResources:
		return "not scanned (--resource excludes it): cannot tell"
	case verify.NarrowedNamespace:
		return "only one namespace was scanned (--namespace): cannot tell"
	}
	return c.Note
}

// encryptionSummary is the counts in one line, e.g.
// "aescbc:key1=3 (unreadable), identity=2 (later), aescbc:key2=120 (first)";
// "none" when no object was counted.
func encryptionSummary(counts []verify.EncryptionCount) string {
	if len(counts) == 0 {
		return "none"
	}
	parts := make([]string, len(counts))
	for i, c := range counts {
		parts[i] = fmt.Sprintf("%s=%d (%s)", c.Encryption, c.Objects, c.State)
	}
	return strings.Join(parts, ", ")
}

func writeVerifyTable(w io.Writer, r *verify.Report) error {
	ew := &errWriter{w: w}
	consistency := "consistent"
	if !r.Consistent {
		consistency = "NOT consistent"
	}
	ew.printf("Revision %d (%s), target %s\n", r.Revision, consistency, r.Target)
	for _, rs := range r.Restarts {
		ew.printf("WARNING: the pinned revision was compacted during the scan; continued after %s at revision %d\n", rs.AfterKey, rs.Revision)
	}
	for _, a := range r.Alarms {
		ew.printf("ALARM: etcd %s: etcd refuses every write of every client (kube-apiserver's too) until it is disarmed; for NOSPACE make room ('etcdctl compact REV' at the current revision, 'etcdctl defrag' on every member, 'etcdctl alarm disarm', or a larger --quota-backend-bytes)\n", a)
	}
	ew.printf("\n")

	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tOBJECTS\tCURRENT\tSTALE\tUNREADABLE\tWHY")
	for _, rr := range r.Resources {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", rr.Name(), rr.Objects, rr.Current, rr.Stale, rr.Unreadable, why(rr))
	}
	s := r.Summary
	fmt.Fprintf(tw, "TOTAL\t%d\t%d\t%d\t%d\t\n", s.Objects, s.Current, s.Stale, s.Unreadable)
	if err := tw.Flush(); err != nil {
		return err
	}
	if s.NotObjects > 0 {
		ew.printf("(%d key(s) that are not API objects, such as compact_rev_key, were left out)\n", s.NotObjects)
	}
	if len(r.Encryption) > 0 {
		ew.printf("Encryption: %s\n", encryptionSummary(r.Encryption))
	}

	if s.Stale > 0 && r.ShowKeys > 0 {
		ew.printf("\nStale keys (first %d per resource):\n", r.ShowKeys)
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, rr := range r.Resources {
			for _, k := range rr.StaleKeys {
				drops := ""
				if len(k.Dropped) > 0 {
					drops = " drops " + strings.Join(k.Dropped, ",")
				}
				fmt.Fprintf(tw, "  %s\t%s\t->\t%s\t[%s]%s\n", k.Key, form(k.From), form(k.To), textfmt.Join(k.Reasons, ","), drops)
			}
			if more := rr.Stale - int64(len(rr.StaleKeys)); more > 0 && len(rr.StaleKeys) > 0 {
				fmt.Fprintf(tw, "  ... %d more %s\t\t\t\t\n", more, rr.Name())
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.FieldLoss) > 0 {
		if err := writeFieldLossTable(ew, r.FieldLoss, false); err != nil {
			return err
		}
	}
	if s.Unreadable > 0 && r.ShowKeys > 0 {
		ew.printf("\nUnreadable keys (first %d per resource):\n", r.ShowKeys)
		for _, rr := range r.Resources {
			for _, k := range rr.UnreadableKeys {
				line := fmt.Sprintf("  %s  %s", k.Key, k.Reason)
				if k.Detail != "" {
					line += ": " + k.Detail
				}
				ew.printf("%s\n", line)
			}
			if more := rr.Unreadable - int64(len(rr.UnreadableKeys)); more > 0 && len(rr.UnreadableKeys) > 0 {
				ew.printf("  ... %d more %s\n", more, rr.Name())
			}
		}
	}

	if s.Orphaned > 0 {
		if err := writeOrphans(ew, r.Orphaned, r.ShowKeys); err != nil {
			return err
		}
	}

	if len(r.CRDs) > 0 {
		ew.printf("\nCRDs:\n")
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CRD\tSTORAGE-VERSION\tSTORED-VERSIONS\tOBJECTS\tNOT-IN-STORAGE-VERSION\tTRIMMABLE")
		for _, c := range r.CRDs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", c.Name, c.StorageVersion, strings.Join(c.StoredVersions, ","), c.Objects, c.ObjectsNotInStorageVersion, trimmable(c))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, c := range r.CRDs {
			if c.Trimmable {
				ew.printf("  %s: %s (kubectl patch crd %s --subresource=status --type=merge -p '{\"status\":{\"storedVersions\":[\"%s\"]}}')\n", c.Name, crdNote(c), c.Name, c.StorageVersion)
			} else if len(c.StoredVersions) > 1 || (len(c.StoredVersions) == 1 && c.StoredVersions[0] != c.StorageVersion) {
				ew.printf("  %s: not trimmable: %s\n", c.Name, crdNote(c))
			}
		}
	}

	ew.printf("\n%s\n", verifyVerdict(r))
	return ew.err
}

// verifyVerdict is the one-line conclusion, naming the exit code.
func verifyVerdict(r *verify.Report) string {
	s := r.Summary
	notes := ""
	if s.Orphaned > 0 {
		notes = fmt.Sprintf(" %d orphaned key(s) were left out (no resource of this cluster owns them; kube-apiserver never reads them; 'quarantine --reason orphaned' removes them, journaled).", s.Orphaned)
	}
	for _, f := range r.FieldLoss {
		notes += fmt.Sprintf(" The rewrite of %d %s object(s) stored as %s drops fields (listed above; migrate's journal keeps their originals).", f.Objects, f.Name(), f.StoredVersion)
	}
	switch r.ExitCode() {
	case verify.ExitUnreadable:
		if s.Unreadable == 0 {
			return fmt.Sprintf("VERDICT: %d orphaned key(s), which fail the gate (--fail-on-orphaned), and %d object(s) stale: exit 4. Remove them ('quarantine --reason orphaned', journaled) or restore their CRD, or drop --fail-on-orphaned.", s.Orphaned, s.Stale)
		}
		return fmt.Sprintf("VERDICT: %d object(s) unreadable (and %d stale): exit 4. Fix or account for every unreadable key (missing encryption key, unknown kind, corrupt value) before migrating or removing an old key or version.", s.Unreadable, s.Stale) + notes
	case verify.ExitStale:
		if r.EncryptionOnly {
			return fmt.Sprintf("VERDICT: %d of %d object(s) not under the first encryption key, all readable: exit 3. Run migrate --encryption-only, then verify again before removing an old encryption key.", s.Stale, s.Objects) + notes
		}
		return fmt.Sprintf("VERDICT: %d of %d object(s) stale, all readable: exit 3. Run migrate, then verify again before removing an old encryption key or API version.", s.Stale, s.Objects) + notes
	}
	if r.EncryptionOnly {
		return fmt.Sprintf("VERDICT: all %d object(s) under the first encryption key for %s: exit 0. Safe to remove old encryption keys; storage versions were not judged (verify without --encryption-only before removing an API version).", s.Objects, r.Target) + notes
	}
	return fmt.Sprintf("VERDICT: all %d object(s) current for %s: exit 0. Safe to remove old encryption keys and versions no longer listed.", s.Objects, r.Target) + notes
}

// writeFieldLossTable prints the fields a rewrite drops (done: the rewrite
// happened), one line per resource, stored version and field, with the
// number of objects that carry it: paths and counts, never values.
func writeFieldLossTable(w io.Writer, losses []reencode.FieldLoss, done bool) error {
	ew := &errWriter{w: w}
	verb := "the rewrite drops"
	if done {
		verb = "the rewrite dropped"
	}
	ew.printf("\nField loss: fields %s (in the stored version's schema, pruned by the storage version's; kube-apiserver's next write drops them too; no read through the storage version shows them):\n", verb)
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  RESOURCE\tSTORED-VERSION\tSTORAGE-VERSION\tFIELD\tOBJECTS")
	for _, f := range losses {
		for _, fc := range f.Fields {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\n", f.Name(), f.StoredVersion, f.StorageVersion, fc.Path, fc.Objects)
		}
		if f.FieldsNotListed > 0 {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t(%d more beyond %d paths)\t\n", f.Name(), f.StoredVersion, f.StorageVersion, f.FieldsNotListed, reencode.MaxFieldLossPaths)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range losses {
		ew.printf("  %s stored as %s: %d object(s) lose fields, e.g. %s ('inspect %s' names them)\n", f.Name(), f.StoredVersion, f.Objects, f.FirstKey, f.FirstKey)
	}
	return ew.err
}

// writeOrphans prints the orphaned keys by reason and prefix, then up to show
// keys of each.
func writeOrphans(ew *errWriter, groups []decode.OrphanGroup, show int) error {
	ew.printf("\nOrphaned keys (no built-in resource or CRD of this cluster owns them; kube-apiserver never reads them; not counted above):\n")
	tw := tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  REASON\tPREFIX\tKEYS\tDETAIL")
	for _, g := range groups {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", g.Reason, g.Prefix, g.Keys, g.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if show > 0 {
		ew.printf("Orphaned keys (first %d per prefix):\n", show)
		tw = tabwriter.NewWriter(ew, 0, 4, 2, ' ', 0)
		for _, g := range groups {
			for _, k := range g.SampleKeys {
				fmt.Fprintf(tw, "  %s\t%s\n", k, g.Reason)
			}
			if more := g.Keys - int64(len(g.SampleKeys)); more > 0 && len(g.SampleKeys) > 0 {
				fmt.Fprintf(tw, "  ... %d more under %s\t\n", more, g.Prefix)
			}
		}
		return tw.Flush()
	}
	return ew.err
}

func why(rr verify.ResourceReport) string {
	var parts []string
	for _, k := range sortedKeys(rr.StaleBy) {
		part := fmt.Sprintf("%s=%d", k, rr.StaleBy[reencode.Reason(k)])
		if reencode.Reason(k) == reencode.ReasonMediaType && len(rr.StaleMediaTypes) > 0 {
			// Which media type they are in, and which one the target stores.
			part += fmt.Sprintf(" (%s -> %s)", strings.Join(sortedKeys(rr.StaleMediaTypes), ","), orQ(rr.TargetMediaType))
		}
		parts = append(parts, part)
	}
	if rr.Reencode > 0 {
		parts = append(parts, fmt.Sprintf("(current, would re-encode: %d)", rr.Reencode))
	}
	for _, k := range sortedKeys(rr.UnreadableBy) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, rr.UnreadableBy[decode.Reason(k)]))
	}
	return strings.Join(parts, " ")
}

func sortedKeys[K ~string, V any](m map[K]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, string(k))
	}
	sort.Strings(out)
	return out
}

func form(f *reencode.Form) string {
	if f == nil {
		return "?"
	}
	return fmt.Sprintf("%s %s %s", orQ(f.Version), orQ(f.MediaType), orQ(f.Encryption))
}

func orQ(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

// trimmable is the CRD table's last column: "done" when storedVersions is already
// just the storage version.
func trimmable(c verify.CRDStatus) string {
	if len(c.StoredVersions) == 1 && c.StoredVersions[0] == c.StorageVersion {
		return "done"
	}
	return yesNo(c.Trimmable)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// errWriter keeps the first write error.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) {
	fmt.Fprintf(e, format, args...)
}
