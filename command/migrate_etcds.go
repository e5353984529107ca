package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/writerun"
)

// etcdMigration is migrate's run in one etcd of a cluster kept in several.
type etcdMigration struct {
	etcd apiserverconfig.Etcd
	s    *session
	opts migrate.Options
	run  *writerun.Etcd
	sum  *migrate.Summary
	err  error
}

// runMigrateEtcds is migrate on a cluster whose kube-apiserver keeps
// resources in several etcds (--etcd-servers-overrides): one run, one run
// directory, a session, liveness watch, preflight, journal and snapshot per
// etcd (the main etcd's under the usual names, the others' named by their
// resources: writerun.EtcdFile). Every etcd's watch has its verdict and every
// etcd's preflight has passed before the first write on any (ready); the
// etcds are then migrated one after the other, the main one first; a
// refusal or failure in one stops the run (the etcds before it are undone
// by 'rollback --run' as a whole). The exit code is the worst of them.
func (o *migrateOptions) runMigrateEtcds(ctx context.Context, es apiserverconfig.Etcds) error {
	ios := o.scan.io
	if o.requested || o.record {
		return usageErr("--requested and --record: kube-apiserver keeps resources in several etcds (--etcd-servers-overrides): not supported there yet; migrate without them")
	}
	opened, err := o.scan.openEtcds(ctx, es, "migrate", openToWrite)
	defer closeEtcds(opened)
	if err != nil {
		return err
	}
	var runs []*etcdMigration
	for _, x := range opened {
		runs = append(runs, &etcdMigration{etcd: x.etcd, s: x.s})
	}
	if len(runs) == 0 {
		return usageErr("--resource: no etcd of the cluster holds the resources named")
	}
	// The cluster's lock, and the run's record of its main etcd, are the
	// main etcd's, read or not (--resource may name only resources kept
	// elsewhere).
	prefix := runs[0].s.env.Resolver.Prefix()
	mainCli := runs[0].s.cli
	if !runs[0].etcd.Main() {
		if mainCli, err = connect(ctx, io.Discard, o.scan.etcd, o.scan.prov, o.scan.api); err != nil {
			return fmt.Errorf("%s: %w", es[0].Label(), err)
		}
		defer mainCli.Close()
	}
	cfg := o.undo.runConfig(ios.errOut, "migrate", mainCli, prefix, o.dryRun, false, o.live)
	return doWrite(ctx, cfg, writerun.Stage{Write: func(ctx context.Context, wr *writerun.Run) (writerun.Result, error) {
		rep, err := o.migrateEtcds(ctx, wr, runs)
		return writerun.Result{Written: rep.written(), Summary: rep}, err
	}})
}

// migrateEtcds migrates each etcd of runs in the writing run.
func (o *migrateOptions) migrateEtcds(ctx context.Context, wr *writerun.Run, runs []*etcdMigration) (*etcdsReport, error) {
	ios := o.scan.io
	rep := &etcdsReport{}
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	for _, r := range runs {
		r.opts = o.runOptions(writeCtx, wr)
		spec := writerun.EtcdSpec{Endpoints: r.s.endpoints(), Client: r.s.env.Client, Prefix: r.s.env.Resolver.Prefix()}
		if !r.etcd.Main() {
			spec.Name = r.etcd.Name
			r.opts.OtherEtcd = r.etcd.Name
		}
		spec.Preflight = func(ctx context.Context) error { return migrate.Preflight(ctx, r.s.env, r.opts) }
		e, err := wr.AddEtcd(ctx, spec)
		if err != nil {
			return rep, err
		}
		r.opts.Journal, r.opts.Snapshot = e.Journal, e.Snapshot
		r.run, r.opts.Watch = e, e.Watch
		r.opts.OnPreflight = func(lines []string) error {
			if err := wr.Ready(ctx, e); err != nil {
				return err
			}
			return wr.Record(e.Label(), lines)
		}
	}
	for _, r := range runs {
		prog := newProgress(ios.errOut, "migrate "+r.etcd.Label(), countKeys(ctx, r.s.env))
		dry := r.opts.DryRun
		r.opts.Progress = func(n migrate.Counts) { prog.Set(objectsDone(dry, n)) }
		r.sum, r.err = migrate.Run(ctx, r.s.env, r.opts)
		prog.Finish()
		rep.add(r.etcd, r.s.endpoints(), r.sum)
		if r.err != nil {
			break
		}
	}
	// A writer on an etcd migrated earlier, while the later ones were.
	for _, r := range runs {
		if r.err == nil && r.sum != nil && r.sum.Summary.Rewritten > 0 {
			if serr := r.run.Watch.Settle(writeCtx); serr != nil {
				r.err = fmt.Errorf("%s: %w", r.etcd.Label(), serr)
			}
		}
	}
	if err := printReport(ios.out, o.output, rep); err != nil {
		return rep, err
	}
	return rep, worstOf(runs)
}

// etcdHolds says what etcd e of es holds, for the line naming it.
func etcdHolds(es apiserverconfig.Etcds, e apiserverconfig.Etcd) string {
	if e.Main() {
		return "every resource but " + strings.Join(es.MovedNames(), ", ")
	}
	return strings.Join(e.ResourceNames(), ", ") + ", --etcd-servers-overrides"
}

// worstOf is the error of the etcd runs with the worst exit code (nil when
// every one succeeded), naming its etcd.
func worstOf(runs []*etcdMigration) error {
	var worst error
	code := exitOK
	for _, r := range runs {
		err := r.err
		if err == nil && r.sum != nil {
			switch {
			case r.sum.Summary.Failed > 0:
				err = &codeError{code: exitError, err: fmt.Errorf("%d write(s) failed; see the failures above; run again to retry", r.sum.Summary.Failed)}
			case r.sum.Summary.Unreadable > 0:
				err = &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s) left untouched", r.sum.Summary.Unreadable)}
			}
		}
		if err == nil {
			continue
		}
		err = stoppedByWriter(err)
		if c := exitCodeOf(err); worst == nil || severity(c) > severity(code) {
			worst, code = prefixErr(r.etcd.Label(), err), c
		}
	}
	return worst
}

// severity orders exit codes from the best to the worst: of the runs of
// several etcds, the worst is the command's (any code not listed ranks as
// exitError).
func severity(code int) int {
	if r, ok := exitSeverity[code]; ok {
		return r
	}
	return exitSeverity[exitError]
}

var exitSeverity = map[int]int{exitOK: 0, exitStale: 1, exitUnreadable: 2, exitError: 3, exitUsage: 3, exitWriter: 4, exitInternal: 5}

// prefixErr names where err happened (unless it names its etcd itself),
// keeping its exit code.
func prefixErr(where string, err error) error {
	if errors.As(err, new(*writerun.EtcdError)) {
		return err
	}
	if ce, ok := err.(*codeError); ok {
		return &codeError{code: ce.code, err: fmt.Errorf("%s: %w", where, ce.err)}
	}
	return &codeError{code: exitCodeOf(err), err: fmt.Errorf("%s: %w", where, err)}
}

// etcdsReport is migrate's summary of each etcd of a cluster kept in
// several.
type etcdsReport struct {
	Etcds []etcdSummary `json:"etcds"`
}

type etcdSummary struct {
	// Etcd is "" for the main etcd, else the resources kept there.
	Etcd      string   `json:"etcd"`
	Endpoints []string `json:"endpoints"`
	*migrate.Summary
}

func (r *etcdsReport) add(e apiserverconfig.Etcd, endpoints []string, sum *migrate.Summary) {
	if sum != nil {
		r.Etcds = append(r.Etcds, etcdSummary{Etcd: e.Name, Endpoints: endpoints, Summary: sum})
	}
}

func (r *etcdsReport) written() int64 {
	var n int64
	for _, e := range r.Etcds {
		n += e.Summary.Summary.Rewritten
	}
	return n
}

func (r *etcdsReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*etcdsReport
	}{build, r}
}

func (r *etcdsReport) table(w io.Writer) error {
	for _, e := range r.Etcds {
		if err := etcdHeading(w, e.Etcd, e.Endpoints); err != nil {
			return err
		}
		if err := writeSummaryTable(w, e.Summary); err != nil {
			return err
		}
	}
	return nil
}
