package command

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/plan"
	"kube-etcd-migrate/writerun"
)

// runPlanEtcds is plan on a cluster whose kube-apiserver keeps resources
// in several etcds (--etcd-servers-overrides): a plan per etcd (what
// migrate checks and decides there), and one exit code: a blocker in any
// etcd is migrate's refusal of the whole run.
func (o *planOptions) runPlanEtcds(ctx context.Context, es apiserverconfig.Etcds, started time.Time) error {
	stateDir := o.undo.stateDir
	if o.undo.noUndo {
		stateDir = ""
	}
	rep := &etcdsPlanReport{}
	var blockers []string
	unreadable := int64(0)
	opened, err := o.scan.openEtcds(ctx, es, "plan", openToWrite)
	defer closeEtcds(opened)
	if err != nil {
		return err
	}
	for _, x := range opened {
		e, s := x.etcd, x.s
		mo := o.runOptions(ctx, nil)
		if !e.Main() {
			mo.OtherEtcd = e.Name
			mo.Journal, mo.Snapshot = writerun.EtcdFile(mo.Journal, e.Name), writerun.EtcdFile(mo.Snapshot, e.Name)
		}
		p, err := plan.Run(ctx, s.env, plan.Options{Migrate: mo, StateDir: stateDir, Started: started})
		if err != nil {
			return prefixErr(e.Label(), err)
		}
		for i, b := range p.Blockers {
			if b.Cause != nil {
				p.Blockers[i].Problem = cliMessage(b.Cause)
			}
			blockers = append(blockers, e.Label()+": "+b.Check)
		}
		unreadable += p.Summary.Unreadable
		rep.Etcds = append(rep.Etcds, etcdPlan{etcd: e, plan: p})
	}
	if err := printReport(o.scan.io.out, o.output, rep); err != nil {
		return err
	}
	if len(blockers) > 0 {
		return &codeError{code: exitError, err: fmt.Errorf("migrate would refuse: %d blocker(s) (%s); each is listed above with its remedy", len(blockers), strings.Join(blockers, ", "))}
	}
	if unreadable > 0 {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s): migrate would leave them untouched and exit 4", unreadable)}
	}
	return nil
}

// etcdsPlanReport is the plan of each etcd of a cluster kept in several.
type etcdsPlanReport struct {
	Etcds []etcdPlan
}

type etcdPlan struct {
	etcd apiserverconfig.Etcd
	plan *plan.Plan
}

func (r *etcdsPlanReport) table(w io.Writer) error {
	for _, e := range r.Etcds {
		if err := etcdHeading(w, e.etcd.Name, e.etcd.Servers); err != nil {
			return err
		}
		if err := (planReport{e.plan}).table(w); err != nil {
			return err
		}
	}
	return nil
}

func (r *etcdsPlanReport) stamped(build buildinfo.Info) any {
	type one struct {
		Etcd      string   `json:"etcd"`
		Endpoints []string `json:"endpoints"`
		*plan.Plan
	}
	out := struct {
		Build buildinfo.Info `json:"build"`
		Etcds []one          `json:"etcds"`
	}{Build: build, Etcds: []one{}}
	for _, e := range r.Etcds {
		// planReport's JSON: the blockers with their remedies.
		p := (planReport{e.plan}).stamped(build).(struct {
			Build buildinfo.Info `json:"build"`
			*plan.Plan
		})
		out.Etcds = append(out.Etcds, one{e.etcd.Name, e.etcd.Servers, p.Plan})
	}
	return out
}
