package command

import (
	"time"

	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/storagemigration"
)

// requestFigures are the metrics of the requests' migrations, per resource:
// a resource migrated by several requests adds up what was found stale and
// written; current and unreadable are the last run's.
func requestFigures(res *storagemigration.Result) []metrics.MigrateFigures {
	var out []metrics.MigrateFigures
	at := map[string]int{}
	for _, o := range res.Requests {
		if o.Migration == nil {
			continue
		}
		for _, f := range migrateFigures(o.Migration) {
			i, ok := at[f.Resource]
			if !ok {
				at[f.Resource] = len(out)
				out = append(out, f)
				continue
			}
			g := &out[i]
			g.Current, g.Rewritten, g.Conflicts = f.Current, g.Rewritten+f.Rewritten, g.Conflicts+f.Conflicts
			g.Failed, g.Unreadable, g.Stale = g.Failed+f.Failed, f.Unreadable, g.Stale+f.Stale
		}
	}
	return out
}

func requestsDuration(res *storagemigration.Result) time.Duration {
	var d time.Duration
	for _, o := range res.Requests {
		if o.Migration != nil {
			d += o.Migration.Duration
		}
	}
	return d
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
