package command

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/storagemigration"
)

// requestsValue is the plan of the pending StorageVersionMigration requests
// as JSON shows it: each note in words (requestNote), each CRD's too.
func requestsValue(p *storagemigration.Plan) *storagemigration.Plan {
	if p == nil {
		return nil
	}
	c := *p
	if p.Pending != nil {
		c.Pending = make([]storagemigration.PlannedRequest, len(p.Pending))
		for i, r := range p.Pending {
			r.Note = requestNote(r)
			if r.CRD != nil {
				crd := *r.CRD
				crd.Note = crdNote(crd)
				r.CRD = &crd
			}
			c.Pending[i] = r
		}
	}
	return &c
}

// requestNote is why a request is skipped, failed or not judged: the
// plan's own words, or, for a resource this verify run did not scan whole,
// the flags that narrowed it.
func requestNote(r storagemigration.PlannedRequest) string {
	if r.Action == storagemigration.ActionMigrate && !r.Scanned && r.Note == "" {
		return "not (entirely) scanned by this verify run (--resource, --namespace)"
	}
	return r.Note
}

// writeRequestsTable prints the plan after verify's table.
func writeRequestsTable(w io.Writer, p *storagemigration.Plan) error {
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
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", r.Name, r.GroupResource(), r.Created.UTC().Format(time.RFC3339), r.Phase, would(r))
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
func would(r storagemigration.PlannedRequest) string {
	switch r.Action {
	case storagemigration.ActionSkip:
		return "skip: " + r.Note
	case storagemigration.ActionFail:
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
		parts = append(parts, requestNote(r))
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

// requestedReport is what 'migrate --requested' did with each request.
type requestedReport struct{ res *storagemigration.Result }

func (r requestedReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		*storagemigration.Result
	}{build, r.res}
}

func (r requestedReport) table(w io.Writer) error {
	res := r.res
	for _, line := range res.Preflight {
		fmt.Fprintf(w, "preflight: ok: %s\n", line)
	}
	for _, u := range res.Unreadable {
		fmt.Fprintf(w, "unreadable request: %s\n", u)
	}
	if len(res.Requests) == 0 {
		_, err := fmt.Fprintf(w, "no pending StorageVersionMigration request (%d finished)\n", res.Finished)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REQUEST\tRESOURCE\tRESULT\tSCANNED\tREWRITTEN\tCONFLICTS\tUNREADABLE\tRESOURCEVERSION\tMESSAGE")
	for _, o := range res.Requests {
		var c migrate.Counts
		if o.Migration != nil {
			c = o.Migration.Summary
		}
		rewritten := c.Rewritten
		if res.DryRun {
			rewritten = c.Stale
		}
		gr := schema.GroupResource{Group: o.Group, Resource: o.Resource}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", o.Name, gr, o.Result, c.Scanned, rewritten, c.Conflicts, c.Unreadable, o.ResourceVersion, o.Message)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, o := range res.Requests {
		if c := o.CRD; c != nil {
			line := fmt.Sprintf("crd %s: storedVersions %v", c.Name, c.StoredVersions)
			for _, s := range []string{c.Reason, c.Message} {
				if s != "" {
					line += ": " + s
				}
			}
			fmt.Fprintln(w, line)
		}
	}
	return nil
}
