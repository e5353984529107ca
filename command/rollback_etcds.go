package command

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/writerun"
)

// etcdRollback is the rollback, in one of the cluster's other etcds
// (--etcd-servers-overrides), of the runs undone: their journals there,
// newest first, read whole and checked before the first write on any etcd
// (prepare), undone once the main etcd's are (undoEtcd).
type etcdRollback struct {
	*rollback.EtcdJournals

	cli       *clientv3.Client
	prefix    string
	etcd      *writerun.Etcd
	checked   *rollback.Checked
	preflight []string
	refused   error
	res       rollback.RollbackResult
}

func (r *etcdRollback) label() string { return "etcd of " + r.Name }

func (r *etcdRollback) close() {
	if r.cli != nil {
		r.cli.Close()
	}
}

// prepare connects to r's etcd (the endpoints its runs recorded, the TLS
// files of the main etcd), starts its liveness watch, reads every journal
// whole and checks what the rollback needs there (alarms, quota), then
// waits for the watch's verdict: all before the first write on any etcd.
func (o *rollbackOptions) prepare(ctx context.Context, wr *writerun.Run, r *etcdRollback) error {
	fmt.Fprintf(o.io.errOut, "%s: %s (its journals: %s)\n", r.label(), strings.Join(r.Endpoints, ","), strings.Join(r.Paths(), ", "))
	cli, err := connectTo(ctx, io.Discard, o.etcd, o.prov, o.api, r.Endpoints)
	if err != nil {
		return err
	}
	r.cli = cli
	r.prefix = r.Prefix()
	if r.etcd, err = wr.AddEtcd(ctx, writerun.EtcdSpec{Name: r.Name, Endpoints: r.Endpoints, Client: cli, Prefix: r.prefix}); err != nil {
		return err
	}
	cfg, closeEnc, err := o.checkConfig(ctx, r.EtcdJournals, r.prefix)
	if err != nil {
		return err
	}
	defer closeEnc()
	checked, err := o.checkEtcd(ctx, cli, cfg)
	if err != nil {
		return err
	}
	r.checked, r.preflight, r.refused = checked, checked.Preflight, checked.Refused
	line, err := r.etcd.Watch.Verdict(ctx)
	if err != nil {
		return err
	}
	if line != "" {
		r.preflight = append(r.preflight, line)
	}
	return nil
}

// undoEtcd undoes r's journals, with the rollback's own undo there beside its
// main one (u nil: none).
func (o *rollbackOptions) undoEtcd(ctx context.Context, r *etcdRollback) error {
	opts := rollback.RollbackOptions{DryRun: o.dryRun, CompactHistory: o.space.compactHistory, AllowUnverified: o.allowUnverified, Check: r.checked.Undo, Watch: r.etcd.Watch, Quota: &r.checked.Quota}
	j, err := r.etcd.OpenJournal(ctx, "rollback", r.prefix)
	if err != nil {
		return err
	}
	if j != nil {
		defer j.Close()
		opts.Journal, opts.Snapshot = j, r.etcd.Snapshot
	}
	res, err := rollback.RollbackJournals(ctx, r.cli, &etcdscan.Writer{Client: r.cli}, r.Paths(), opts)
	res.Preflight = append(slices.Clip(r.preflight), res.Preflight...)
	r.res = res
	if err != nil {
		return stoppedByWriter(err)
	}
	if r.refused != nil {
		return r.refused // a dry run: the rollback would be refused
	}
	if res.Failed > 0 {
		return &codeError{code: exitError, err: fmt.Errorf("%d key(s) could not be restored", res.Failed)}
	}
	return nil
}

// etcdsRollbackReport is rollback's report of each etcd of a cluster kept
// in several.
type etcdsRollbackReport struct {
	Etcds []etcdRollbackResult `json:"etcds"`
}

type etcdRollbackResult struct {
	// Etcd is "" for the main etcd, else the resources kept there.
	Etcd      string   `json:"etcd"`
	Endpoints []string `json:"endpoints"`
	rollback.RollbackResult
}

func (r etcdsRollbackReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		etcdsRollbackReport
	}{build, r}
}

func (r etcdsRollbackReport) table(w io.Writer) error {
	for _, e := range r.Etcds {
		if err := etcdHeading(w, e.Etcd, e.Endpoints); err != nil {
			return err
		}
		if err := (rollbackReport{e.RollbackResult}).table(w); err != nil {
			return err
		}
	}
	return nil
}

// finishEtcds is the end of a rollback of a cluster kept in several etcds:
// once the main etcd's journals are undone (mainRes, mainErr; refused: a
// dry run's refusal there), each other etcd's, then one report and the
// worst exit code. res is what the rollback's run records as written: every
// etcd's restored keys.
func (o *rollbackOptions) finishEtcds(ctx context.Context, wr *writerun.Run, others []*etcdRollback, mainEndpoints []string, res *rollback.RollbackResult, mainErr, refused error) error {
	rep := etcdsRollbackReport{Etcds: []etcdRollbackResult{{Endpoints: mainEndpoints, RollbackResult: *res}}}
	err := mainErr
	if err != nil {
		err = stoppedByWriter(err)
	} else if refused != nil {
		err = refused
	} else if res.Failed > 0 {
		err = &codeError{code: exitError, err: fmt.Errorf("%d key(s) could not be restored", res.Failed)}
	}
	worst := err
	if worst != nil {
		worst = prefixErr("main etcd", worst)
	}
	// A dry run says what every etcd would do; a rollback that failed in
	// the main etcd stops there.
	if err == nil || o.dryRun {
		for _, r := range others {
			rerr := o.undoEtcd(ctx, r)
			rep.Etcds = append(rep.Etcds, etcdRollbackResult{Etcd: r.Name, Endpoints: r.Endpoints, RollbackResult: r.res})
			res.Restored += r.res.Restored
			if rerr != nil {
				if worst == nil || severity(exitCodeOf(rerr)) > severity(exitCodeOf(worst)) {
					worst = prefixErr(r.label(), rerr)
				}
				if !o.dryRun {
					break
				}
			}
		}
	}
	if werr := printReport(o.io.out, o.output, rep); werr != nil && worst == nil {
		worst = werr
	}
	return worst
}

// otherJournalRefusal refuses --journal of a run's journal in another etcd
// of the cluster (--etcd-servers-overrides) without --endpoints: the main
// etcd, which the manifest names, is not where its keys are.
func (o *rollbackOptions) otherJournalRefusal() error {
	if o.journal == "" || o.prov.onCommandLine("endpoints") {
		return nil
	}
	rec, name := o.undo.stateDir.RunOfEtcdJournal(o.journal)
	if rec == nil {
		return nil
	}
	return usageErr("--journal %s is run %s's journal in the etcd of %s (%s), not the main etcd: undo it with --run %s (every etcd of the run), or give that etcd's --endpoints", o.journal, rec.ID, name, strings.Join(rec.Endpoints, ","), rec.ID)
}
