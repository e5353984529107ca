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
	"kube-etcd-migrate/inventory"
)

// inventoryReport is the census.
type inventoryReport struct{ inv *inventory.Inventory }

func (r inventoryReport) table(w io.Writer) error { return writeInventoryTable(w, r.inv) }

func (r inventoryReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*inventory.Inventory
	}{build, r.inv}
}

func writeInventoryTable(w io.Writer, inv *inventory.Inventory) error {
	consistency := "consistent"
	if !inv.Consistent {
		consistency = "NOT consistent: the revision was compacted during the scan"
	}
	if _, err := fmt.Fprintf(w, "Revision %d (%s), prefixes %s\n", inv.Revision, consistency, strings.Join(inv.Prefixes, ", ")); err != nil {
		return err
	}
	for _, rs := range inv.Restarts {
		fmt.Fprintf(w, "WARNING: continued after %s at revision %d\n", rs.AfterKey, rs.Revision)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RESOURCE\tOBJECTS\tBYTES\tLARGEST\tVERSIONS\tMEDIA TYPES\tENCRYPTION\tLEASES\tUNREADABLE")
	for _, r := range inv.Resources {
		unreadable := fmt.Sprint(r.Unreadable)
		if r.Unreadable > 0 {
			unreadable += " (" + breakdown(reasonCounts(r.UnreadableBy)) + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Name(), r.Count, textfmt.BytesCompact(r.Bytes), textfmt.BytesCompact(r.MaxBytes),
			breakdown(r.Versions), breakdown(r.MediaTypes), breakdown(r.Encryption), r.WithLease, unreadable)
	}
	t := inv.Total
	fmt.Fprintf(tw, "TOTAL\t%d\t%s\t\t\t\t\t%d\t%d\n", t.Objects, textfmt.BytesCompact(t.Bytes), t.WithLease, t.Unreadable)
	if err := tw.Flush(); err != nil {
		return err
	}
	if t.Unreadable > 0 && inv.ShowKeys > 0 {
		fmt.Fprintf(w, "\nUnreadable keys (first %d per resource):\n", inv.ShowKeys)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  KEY\tREASON\tDETAIL")
		for _, r := range inv.Resources {
			for _, k := range r.UnreadableKeys {
				fmt.Fprintf(tw, "  %s\t%s\t%s\n", k.Key, k.Reason, k.Detail)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if t.Orphaned > 0 {
		fmt.Fprintf(w, "\nOrphaned keys (%d; no built-in resource or CRD of this cluster owns them; kube-apiserver never reads them):\n", t.Orphaned)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  REASON\tPREFIX\tKEYS\tBYTES\tDETAIL")
		for _, g := range inv.Orphaned {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\n", g.Reason, g.Prefix, g.Keys, textfmt.BytesCompact(g.Bytes), g.Detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		for _, g := range inv.Orphaned {
			for _, k := range g.SampleKeys {
				fmt.Fprintf(tw, "  %s\t%s\n", k, g.Reason)
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if t.NotObjects > 0 {
		fmt.Fprintf(w, "\nKeys that are not API objects (%d):\n", t.NotObjects)
		for _, k := range inv.NotObjects {
			fmt.Fprintf(w, "  %s (%s)\n", k.Key, textfmt.BytesCompact(k.Bytes))
		}
		if n := t.NotObjects - int64(len(inv.NotObjects)); n > 0 {
			fmt.Fprintf(w, "  ... %d more\n", n)
		}
	}
	orphaned := ""
	if t.Orphaned > 0 {
		orphaned = fmt.Sprintf(", %d orphaned", t.Orphaned)
	}
	_, err := fmt.Fprintf(w, "\n%d keys, %d objects%s, %s\n", t.Keys, t.Objects, orphaned, textfmt.BytesCompact(t.Bytes))
	return err
}

func reasonCounts(m map[decode.Reason]int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		out[string(k)] = v
	}
	return out
}

// breakdown prints "v1=3,v1beta1=1", largest count first.
func breakdown(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ",")
}
