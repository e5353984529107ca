package restore

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
)

// selection is the Selector resolved against the live cluster's resources.
type selection struct {
	namespaces map[string]bool
	resources  map[schema.GroupResource]bool
	names      map[string]bool
	keys       []string
	// prefixes are the key ranges of the backup read.
	prefixes []string
	// events: Events were asked for by --resource.
	events bool
	// leases: coordination Leases were asked for by --resource.
	leases bool
}

var (
	eventsResource = schema.GroupResource{Resource: "events"}
	leasesResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	nsResource     = schema.GroupResource{Resource: "namespaces"}
)

func setOf(vals []string) map[string]bool {
	if len(vals) == 0 {
		return nil
	}
	m := map[string]bool{}
	for _, v := range vals {
		m[v] = true
	}
	return m
}

func (r *run) selection() (selection, error) {
	s := r.opts.Select
	sel := selection{namespaces: setOf(s.Namespaces), names: setOf(s.Names)}
	root := r.env.Resolver.Prefix() + "/"
	for _, k := range s.Keys {
		if !strings.HasPrefix(k, root) {
			return sel, &SelectError{Option: "key", Value: k, Msg: fmt.Sprintf("not under kube-apiserver's prefix %s", root)}
		}
		sel.keys = append(sel.keys, k)
	}
	for _, v := range s.Resources {
		gr, err := r.env.Resolver.ParseResource(v)
		if err != nil {
			msg := err.Error()
			if strings.Contains(v, ".") {
				msg += fmt.Sprintf(" (if it is a custom resource whose CRD was deleted too: restore the CRD first, with --resource customresourcedefinitions.apiextensions.k8s.io --name %s)", v)
			}
			return sel, &SelectError{Option: "resource", Value: v, Msg: msg}
		}
		if sel.resources == nil {
			sel.resources = map[schema.GroupResource]bool{}
		}
		sel.resources[gr] = true
		switch gr {
		case eventsResource, schema.GroupResource{Group: "events.k8s.io", Resource: "events"}:
			// One key for both groups: /registry/events, core Events.
			sel.events = true
			delete(sel.resources, gr)
			sel.resources[eventsResource] = true
		case leasesResource:
			sel.leases = true
		}
	}
	// The key ranges: the raw prefixes; else each resource's (per
	// namespace); else the whole prefix.
	switch {
	case len(sel.keys) > 0:
		sel.prefixes = append(sel.prefixes, sel.keys...)
	case len(sel.resources) > 0:
		for gr := range sel.resources {
			if len(sel.namespaces) == 0 {
				p, err := r.env.Resolver.KeyPrefix(gr, "")
				if err != nil {
					return sel, &SelectError{Option: "resource", Value: gr.String(), Msg: err.Error()}
				}
				sel.prefixes = append(sel.prefixes, p)
				continue
			}
			for ns := range sel.namespaces {
				p, err := r.env.Resolver.KeyPrefix(gr, ns)
				if err != nil {
					return sel, &SelectError{Option: "resource", Value: gr.String(), Msg: err.Error()}
				}
				sel.prefixes = append(sel.prefixes, p)
			}
		}
	default:
		sel.prefixes = []string{root}
	}
	sort.Strings(sel.prefixes)
	sel.prefixes = slices.Compact(sel.prefixes)
	// A prefix inside another is read once.
	var out []string
	for _, p := range sel.prefixes {
		if len(out) > 0 && strings.HasPrefix(p, out[len(out)-1]) {
			continue
		}
		out = append(out, p)
	}
	sel.prefixes = out
	return sel, nil
}

// selects says whether the selection takes the key info names.
func (s *selection) selects(key string, info decode.KeyInfo) bool {
	if len(s.keys) > 0 && !slices.ContainsFunc(s.keys, func(p string) bool { return strings.HasPrefix(key, p) }) {
		return false
	}
	if s.resources != nil && !s.resources[info.Resource] {
		return false
	}
	if s.namespaces != nil && !s.namespaces[info.Namespace] {
		return false
	}
	if s.names != nil && !s.names[info.Name] {
		return false
	}
	return true
}
