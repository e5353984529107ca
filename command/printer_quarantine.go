package command

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/quarantine"
)

// quarantineReport is what quarantine found and did.
type quarantineReport struct{ res *quarantine.Result }

func (q quarantineReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*quarantine.Result
	}{build, q.res}
}

func (q quarantineReport) table(w io.Writer) error {
	r := q.res
	consistency := "consistent"
	if !r.Consistent {
		consistency = "NOT consistent: the revision was compacted during the scan"
	}
	fmt.Fprintf(w, "Revision %d (%s), %s, reasons %s\n", r.Revision, consistency, strings.Join(r.Prefixes, ", "), textfmt.Join(r.Reasons, ", "))
	for _, p := range r.Preflight {
		fmt.Fprintf(w, "preflight: %s\n", p)
	}
	if len(r.Entries) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tRESOURCE\tREASON\tSTORED AS\tSTATUS\tNOTE")
		for _, e := range r.Entries {
			// Why it is unreadable is in STORED AS and REASON (the detail is in
			// the JSON); the note says why something is kept or not removed.
			reason := string(e.Reason)
			if e.Orphan != "" {
				reason += " (" + string(e.Orphan) + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Key, orDash(e.Resource), reason, orDash(e.Encryption), e.Status, e.Note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if r.KeptUnlisted > 0 {
			fmt.Fprintf(w, "... and %d more kept\n", r.KeptUnlisted)
		}
	}
	fmt.Fprintln(w)
	found, what := r.Unreadable, "unreadable object(s)"
	if quarantine.OnlyOrphaned(r.Reasons) {
		found, what = r.Orphaned, "orphaned key(s)"
	}
	if r.DryRun {
		_, err := fmt.Fprintf(w, "dry run: would remove %d of %d %s (%d keys scanned), keep %d; nothing was written\n", r.WouldRemove, found, what, r.Objects, r.Kept)
		return err
	}
	fmt.Fprintf(w, "removed %d of %d %s (%d keys scanned), kept %d, conflicts %d, failed %d", r.Removed, found, what, r.Objects, r.Kept, r.Conflicts, r.Failed)
	switch {
	case r.Removed > 0 && r.Journal != "":
		fmt.Fprintf(w, "; their values are in the journal %s ('rollback --journal %s' puts them back)", r.Journal, r.Journal)
	case r.Removed > 0:
		// An --output-snapshot without --journal.
		fmt.Fprint(w, "; the input snapshot, never modified, still holds them")
	}
	_, err := fmt.Fprintln(w)
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
