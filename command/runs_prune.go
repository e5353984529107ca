package command

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/writerun"
)

// runPrune is 'runs --prune': the oldest runs removed as StateDir.Prune's rule
// says (docs/commands.md#runs), or with --dry-run what would be.
func (o *runsOptions) runPrune() error {
	res, err := o.stateDir.Prune(writerun.PruneOptions{Keep: o.keep, Before: o.before, DryRun: o.dryRun})
	var nf *writerun.NotFoundError
	if errors.As(err, &nf) {
		return usageErr("--before: %v", err)
	}
	var le *writerun.LockedError
	if errors.As(err, &le) {
		return fmt.Errorf("--state-dir: %w; nothing was removed", err)
	}
	if perr := printReport(o.io.out, o.output, pruneReport{o.stateDir, res}); perr != nil && err == nil {
		err = perr
	}
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	return nil
}

// pruneReport is what a prune removed (would remove), freed and kept.
type pruneReport struct {
	dir writerun.StateDir
	res writerun.PruneResult
}

func (r pruneReport) stamped(build buildinfo.Info) any {
	return struct {
		Build    buildinfo.Info    `json:"build"`
		StateDir writerun.StateDir `json:"stateDir"`
		writerun.PruneResult
	}{build, r.dir, r.res}
}

func (r pruneReport) table(w io.Writer) error {
	verb, frees := "removed", "freed"
	if r.res.DryRun {
		verb, frees = "would remove", "would free"
	}
	for _, p := range r.res.Removed {
		fmt.Fprintf(w, "%s %s (%s, %s)\n", verb, p.ID, p.Dir, textfmt.Bytes(p.Bytes))
		for _, f := range p.Outside {
			fmt.Fprintf(w, "  not removed: %s (run %s's, outside the state directory: remove it yourself once it is not needed)\n", f, p.ID)
		}
	}
	for _, h := range r.res.Held {
		fmt.Fprintf(w, "keeps %s with %s: %s\n", h.ID, h.With, h.Why)
	}
	kept := "none"
	if n := len(r.res.Kept); n > 0 {
		kept = r.res.Kept[0]
		if n > 1 {
			kept += " to " + r.res.Kept[n-1]
		}
	}
	if len(r.res.Removed) == 0 {
		fmt.Fprintf(w, "nothing to remove in %s; keeps %s\n", r.dir, kept)
		return nil
	}
	fmt.Fprintf(w, "%s %s in %s; keeps %s (each undone with every later one: 'kube-etcd-migrate rollback --run ID')\n", frees, textfmt.Bytes(r.res.Freed), r.dir, kept)
	if r.res.DryRun {
		ids := make([]string, len(r.res.Removed))
		for i, p := range r.res.Removed {
			ids[i] = p.ID
		}
		fmt.Fprintf(w, "run the same command without --dry-run to remove %s\n", strings.Join(ids, ", "))
	}
	return nil
}
