package command

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/restore"
)

// restoreReport is what restore found and did, a line per key.
type restoreReport struct{ res *restore.Result }

func (q restoreReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*restore.Result
	}{build, q.res}
}

func (q restoreReport) table(w io.Writer) error {
	r := q.res
	fmt.Fprintf(w, "Backup %s at revision %d, %s; its values need %s\n", r.Backup, r.BackupRevision, strings.Join(r.Prefixes, ", "), orDash(strings.Join(r.Needs, ", ")))
	for _, p := range r.Preflight {
		fmt.Fprintf(w, "preflight: %s\n", p)
	}
	if len(r.Entries) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tRESOURCE\tACTION\tRESULT\tNOTE")
		for _, e := range r.Entries {
			note := e.Note
			if len(e.Owners) > 0 {
				note += " (" + strings.Join(e.Owners, ", ") + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Key, orDash(e.Resource), e.Action, orDash(e.Result), note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w)
	counts := fmt.Sprintf("create %d, overwrite %d, same %d, exists %d, skipped %d, unreadable %d, dangling-owner %d", r.Create, r.Overwrite, r.Same, r.Exists, r.Skipped, r.Unreadable, r.Dangling)
	if r.Manifests > 0 {
		_, err := fmt.Fprintf(w, "%d manifest(s) written (%d Secret(s)), skipped %d, unreadable %d; etcd was only read\n", r.Manifests, r.Secrets, r.Skipped, r.Unreadable)
		return err
	}
	if r.DryRun {
		_, err := fmt.Fprintf(w, "dry run: %s; nothing was written\n", counts)
		return err
	}
	_, err := fmt.Fprintf(w, "%s; written %d, conflicts %d, failed %d\n", counts, r.Written, r.Conflicts, r.Failed)
	return err
}
