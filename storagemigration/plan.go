package storagemigration

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

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

// PlannedRequest is one pending request and what carrying it out would do.
type PlannedRequest struct {
	Request
	// Action: "migrate", "fail" (with the Failed condition's Message) or
	// "skip" (left pending, Note says why).
	Action  string `json:"action"`
	Message string `json:"message,omitempty"`
	Note    string `json:"note,omitempty"`
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
			pr.Action, pr.Note = "skip", t.note
		case missing:
			pr.Action, pr.Message, pr.Note = "fail", messageNoResource, t.note
		default:
			pr.Action = "migrate"
			pr.Scanned = (env.Filter == nil || env.Filter[t.scan]) && env.Config.Namespace == ""
			if !pr.Scanned {
				pr.Note = "not (entirely) scanned by this verify run (--resource, --namespace)"
			}
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
					pr.Action = "fail"
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

// WriteTable prints the plan as verify's table output does.
func (p *Plan) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "\nStorageVersionMigration requests: %d pending, %d finished\n", len(p.Pending), p.Finished)
	if !p.Served {
		fmt.Fprintf(w, "  %s: 'migrate --requested' would refuse\n", p.NotServed)
	}
	for _, u := range p.Unreadable {
		fmt.Fprintf(w, "  unreadable: %s\n", u)
	}
	if len(p.Pending) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tRESOURCE\tCREATED\tPHASE\tWOULD")
	for _, r := range p.Pending {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", r.Name, r.GroupResource(), r.Created.UTC().Format(time.RFC3339), r.Phase, r.would())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Served {
		_, err := fmt.Fprintln(w, "  'kube-etcd-migrate migrate --requested' carries them out offline (with these flags); kube-controller-manager with the StorageVersionMigrator feature gate does it through kube-apiserver.")
		return err
	}
	return nil
}

// would is the WOULD column.
func (r PlannedRequest) would() string {
	switch r.Action {
	case "skip":
		return "skip: " + r.Note
	case "fail":
		if r.Note != "" {
			return fmt.Sprintf("fail: %s (%s)", r.Message, r.Note)
		}
		return "fail: " + r.Message
	}
	var parts []string
	switch {
	case r.After != "":
		parts = append(parts, fmt.Sprintf("after %s, which leaves nothing stale", r.After))
	case !r.Scanned:
		parts = append(parts, r.Note)
	default:
		s := fmt.Sprintf("rewrite %d of %d object(s)", r.Stale+r.Reencode, r.Objects)
		if len(r.StaleBy) > 0 {
			var by []string
			for _, k := range slices.Sorted(maps.Keys(r.StaleBy)) {
				by = append(by, fmt.Sprintf("%s=%d", k, r.StaleBy[k]))
			}
			s += " (" + strings.Join(by, ",") + ")"
		}
		parts = append(parts, s)
	}
	if c := r.CRD; c != nil && r.After == "" {
		if len(c.StoredVersions) == 1 && c.StoredVersions[0] == c.StorageVersion {
			parts = append(parts, "storedVersions already ["+c.StorageVersion+"]")
		} else {
			parts = append(parts, fmt.Sprintf("then storedVersions [%s] -> [%s]", strings.Join(c.StoredVersions, ","), c.StorageVersion))
		}
	}
	return "migrate: " + strings.Join(parts, "; ") + ", Succeeded"
}
