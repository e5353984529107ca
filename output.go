package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/migrate"
)

// progress shows a bar on a terminal and a log line every 10 s otherwise.
type progress struct {
	bar   *progressbar.ProgressBar
	w     io.Writer
	label string
	total int64
	last  time.Time
	start time.Time
	n     int64
}

func newProgress(w io.Writer, label string, total int64) *progress {
	p := &progress{w: w, label: label, total: total, start: time.Now(), last: time.Now()}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions64(max(total, -1),
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription(label),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("keys"),
			progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	return p
}

// Set records how many keys have been processed.
func (p *progress) Set(n int64) {
	p.n = n
	if p.bar != nil {
		_ = p.bar.Set64(n)
		return
	}
	if time.Since(p.last) >= 10*time.Second {
		p.last = time.Now()
		rate := float64(n) / time.Since(p.start).Seconds()
		if p.total > 0 {
			fmt.Fprintf(p.w, "%s: %d/%d keys (%.0f%%), %.0f keys/s\n", p.label, n, p.total, 100*float64(n)/float64(p.total), rate)
		} else {
			fmt.Fprintf(p.w, "%s: %d keys, %.0f keys/s\n", p.label, n, rate)
		}
	}
}

func (p *progress) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeReport writes a report through write, its own writer, and for "json" and
// "yaml" adds a "build" object first (the tool's version, the Kubernetes release
// whose codecs judged the objects, etcd client and Go versions), so that a report
// kept for an audit says which release produced it. Other formats are written
// unchanged.
func writeReport(w io.Writer, format string, write func(w io.Writer, format string) error) error {
	if format != "json" && format != "yaml" {
		return write(w, format)
	}
	var buf bytes.Buffer
	if err := write(&buf, "json"); err != nil {
		return err
	}
	data, err := stampBuild(buf.Bytes())
	if err != nil {
		return err
	}
	if format == "yaml" {
		if data, err = yaml.JSONToYAML(data); err != nil {
			return err
		}
	}
	_, err = w.Write(data)
	return err
}

// stampBuild returns the JSON object report with "build" as its first member,
// indented; the report's own members keep their order.
func stampBuild(report []byte) ([]byte, error) {
	report = bytes.TrimSpace(report)
	if len(report) < 2 || report[0] != '{' || !json.Valid(report) {
		return nil, fmt.Errorf("report is not a JSON object: %.40q", report)
	}
	stamp, err := json.Marshal(struct {
		Build buildinfo.Info `json:"build"`
	}{buildinfo.Get()})
	if err != nil {
		return nil, err
	}
	merged := stamp[:len(stamp)-1] // without its closing brace
	if rest := bytes.TrimSpace(report[1:]); len(rest) > 0 && rest[0] != '}' {
		merged = append(merged, ',')
	}
	merged = append(merged, report[1:]...)
	var out bytes.Buffer
	if err := json.Indent(&out, merged, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func writeSummary(w io.Writer, s *migrate.Summary, format string) error {
	if format == "json" {
		return writeReport(w, format, func(w io.Writer, _ string) error { return writeJSON(w, s) })
	}
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
	// One line per cause, not per key: -o json lists the keys.
	for _, c := range s.Causes {
		fmt.Fprintf(w, "%s: %s: %d key(s), the first %s: %s\n", c.Status, c.Cause, c.Count, c.FirstKey, c.Error)
	}
	if sp := s.Space; sp != nil {
		line := fmt.Sprintf("etcd database: %s before, %s after (at most %s during the run; quota %s)", migrate.HumanBytes(sp.DBSizeBefore), migrate.HumanBytes(sp.DBSizeAfter), migrate.HumanBytes(sp.DBSizeMax), migrate.HumanBytes(sp.Quota.Bytes))
		if sp.Compactions > 0 {
			line += fmt.Sprintf("; --compact-history compacted %d time(s), last at revision %d", sp.Compactions, sp.CompactedAt)
		}
		fmt.Fprintln(w, line)
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
	if s.Interrupted {
		fmt.Fprintln(w, "interrupted: run the same command again to continue; current objects are skipped")
	}
	return nil
}

func writeRollback(w io.Writer, r migrate.RollbackResult, format string) error {
	if format == "json" {
		return writeReport(w, format, func(w io.Writer, _ string) error { return writeJSON(w, r) })
	}
	fmt.Fprintf(w, "restored %d, unchanged %d, skipped %d (changed since), failed %d\n", r.Restored, r.Unchanged, r.Skipped, r.Failed)
	for _, k := range r.Keys {
		fmt.Fprintf(w, "  %s\n", k)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
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

func migrateFigures(s *migrate.Summary) []metrics.MigrateFigures {
	out := make([]metrics.MigrateFigures, 0, len(s.Resources))
	for _, r := range s.Resources {
		out = append(out, metrics.MigrateFigures{
			Resource:   resName(r.Group, r.Resource),
			Current:    r.Current,
			Rewritten:  r.Rewritten,
			Conflicts:  r.Conflicts,
			Failed:     r.Failed,
			Unreadable: r.Unreadable,
			Stale:      r.Stale,
		})
	}
	return out
}
