package command

import (
	"context"
	"fmt"
	"io"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/verify"
)

// runVerifyEtcds is verify on a cluster whose kube-apiserver keeps
// resources in several etcds (--etcd-servers-overrides): a report per etcd
// (the resources kube-apiserver keeps there, read there), and the exit code
// of the worst.
func (o *verifyOptions) runVerifyEtcds(ctx context.Context, es apiserverconfig.Etcds) error {
	if o.metricsFile != "" {
		return usageErr("--metrics-file: kube-apiserver keeps resources in several etcds (--etcd-servers-overrides): not supported there yet")
	}
	rep := &etcdsVerifyReport{}
	code := exitOK
	opened, err := o.scan.openEtcds(ctx, es, "verify", open)
	defer closeEtcds(opened)
	if err != nil {
		return err
	}
	for _, x := range opened {
		e, s := x.etcd, x.s
		r, plan, err := func() (*verify.Report, *storagemigration.Plan, error) {
			r, err := verify.Run(ctx, s.env, verify.Options{ShowKeys: o.showKeys, FailOnOrphaned: o.failOnOrphaned})
			if err != nil {
				return nil, nil, err
			}
			var plan *storagemigration.Plan
			if e.Main() {
				// The requests are objects of the main etcd.
				if plan, err = storagemigration.PlanRequests(ctx, s.env, r); err != nil {
					return nil, nil, err
				}
			}
			return r, plan, nil
		}()
		if err != nil {
			return fmt.Errorf("%s: %w", e.Label(), err)
		}
		rep.Etcds = append(rep.Etcds, etcdVerify{Etcd: e.Name, Endpoints: e.Servers, rep: r, requests: plan})
		if c := r.ExitCode(); severity(c) > severity(code) {
			code = c
		}
	}
	if err := printReport(o.scan.io.out, o.output, rep); err != nil {
		return err
	}
	switch code {
	case exitOK:
		return nil
	case exitStale, exitUnreadable:
		return &codeError{code: code, err: fmt.Errorf("exit %d", code), quiet: true}
	default:
		return fmt.Errorf("verify: exit code %d is none of those documented (exitCodes)", code)
	}
}

// etcdsVerifyReport is verify's report of each etcd of a cluster kept in
// several.
type etcdsVerifyReport struct {
	Etcds []etcdVerify
}

type etcdVerify struct {
	Etcd      string
	Endpoints []string
	rep       *verify.Report
	requests  *storagemigration.Plan
}

func (r *etcdsVerifyReport) table(w io.Writer) error {
	for _, e := range r.Etcds {
		if err := etcdHeading(w, e.Etcd, e.Endpoints); err != nil {
			return err
		}
		if err := (verifyReport{e.rep, e.requests}).table(w); err != nil {
			return err
		}
	}
	return nil
}

func (r *etcdsVerifyReport) stamped(build buildinfo.Info) any {
	type one struct {
		Etcd      string   `json:"etcd"`
		Endpoints []string `json:"endpoints"`
		*verify.Report
		Requests *storagemigration.Plan `json:"storageVersionMigrations,omitempty"`
	}
	out := struct {
		Build buildinfo.Info `json:"build"`
		Etcds []one          `json:"etcds"`
	}{Build: build, Etcds: []one{}}
	for _, e := range r.Etcds {
		out.Etcds = append(out.Etcds, one{e.Etcd, e.Endpoints, verifyValue(e.rep), requestsValue(e.requests)})
	}
	return out
}
