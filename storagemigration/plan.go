package storagemigration

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

// Plan is what 'migrate --requested' would do with the pending requests,
// judged from a verify run of the same keyspace.
type Plan struct {
	// Served says whether the target kube-apiserver serves the API;
	// NotServed says why not (then --requested refuses).
	Served     bool             `json:"served"`
	NotServed  string           `json:"notServed,omitempty"`
	Finished   int              `json:"finished"`
	Pending    []PlannedRequest `json:"pending"`
	Unreadable []string         `json:"unreadable,omitempty"`
}

// What carrying out a pending request would do (PlannedRequest.Action).
const (
	ActionMigrate = "migrate"
	ActionFail    = "fail"
	ActionSkip    = "skip"
)

// PlannedRequest is one pending request and what carrying it out would do.
type PlannedRequest struct {
	Request
	// Action: ActionMigrate, ActionFail (with the Failed condition's
	// Message) or ActionSkip (left pending, Note says why).
	Action  string `json:"action"`
	Message string `json:"message,omitempty"`
	// Note says why a request is skipped or failed; empty for one to
	// migrate, where !Scanned says the verify run's filters left (part of)
	// its resource out.
	Note string `json:"note,omitempty"`
	// After names an earlier request for the same resource, carried out
	// first: this one finds what that one leaves.
	After string `json:"after,omitempty"`
	// Scanned says whether the verify run covered the resource; the counts
	// below are what it found there.
	Scanned    bool           `json:"scanned"`
	Objects    int64          `json:"objects"`
	Stale      int64          `json:"stale"`
	Reencode   int64          `json:"reencode,omitempty"`
	Unreadable int64          `json:"unreadable"`
	StaleBy    map[string]int `json:"staleBy,omitempty"`
	// CRD is the CRD's storedVersions verdict, for a custom resource.
	CRD *verify.CRDStatus `json:"crd,omitempty"`
}

// PlanRequests lists the pending requests with what each would rewrite,
// from rep (a verify run on env). It is nil when etcd holds no request.
func PlanRequests(ctx context.Context, env *pipeline.Env, rep *verify.Report) (*Plan, error) {
	reqs, err := List(ctx, env)
	if err != nil {
		return nil, err
	}
	if len(reqs.All) == 0 && len(reqs.Unreadable) == 0 {
		return nil, nil
	}
	served, why, err := Serving(env)
	if err != nil {
		return nil, err
	}
	ctrl, err := controllerOf(env)
	if err != nil {
		return nil, err
	}
	p := &Plan{Served: served, NotServed: why, Finished: reqs.Finished(), Pending: []PlannedRequest{}, Unreadable: reqs.Unreadable}
	byName := map[string]verify.ResourceReport{}
	for _, r := range rep.Resources {
		byName[r.Name()] = r
	}
	first := map[schema.GroupResource]string{}
	for _, r := range reqs.Pending() {
		pr := PlannedRequest{Request: r}
		t, err := resolve(env, r.GroupResource())
		if err != nil {
			return nil, err
		}
		switch t.kind {
		case unsupported:
			pr.Action, pr.Note = ActionSkip, t.note
		case missing:
			pr.Action, pr.Message, pr.Note = ActionFail, messageNoResource, t.note
		default:
			pr.Action = ActionMigrate
			pr.Scanned = (env.Filter == nil || env.Filter[t.scan]) && env.Config.Namespace == ""
			if prev, ok := first[t.scan]; ok {
				pr.After = prev
			} else {
				first[t.scan] = r.Name
				if rr, ok := byName[t.scan.String()]; ok && pr.Scanned {
					pr.Objects, pr.Stale, pr.Reencode, pr.Unreadable = rr.Objects, rr.Stale, rr.Reencode, rr.Unreadable
					pr.StaleBy = map[string]int{}
					for k, v := range rr.StaleBy {
						pr.StaleBy[string(k)] = v
					}
				}
				if pr.Unreadable > 0 {
					pr.Action = ActionFail
					pr.Message = ctrl.objectsFailedMessage(pr.Unreadable, pr.Objects, fmt.Sprintf("%d object(s) could not be read and were left untouched", pr.Unreadable))
				}
			}
			if t.crd != nil {
				for i := range rep.CRDs {
					if c := rep.CRDs[i]; c.Group == t.crd.Resource.Group && c.Resource == t.crd.Resource.Resource {
						pr.CRD = &c
					}
				}
			}
		}
		p.Pending = append(p.Pending, pr)
	}
	return p, nil
}
