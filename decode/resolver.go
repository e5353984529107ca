package decode

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// KeyInfo says what an etcd key holds.
type KeyInfo struct {
	Key       string               `json:"key"`
	Resource  schema.GroupResource `json:"-"`
	Namespace string               `json:"namespace,omitempty"`
	Name      string               `json:"name"`
	// Custom is true for custom resources (served by a CRD).
	Custom bool `json:"custom,omitempty"`
}

// rawStorageKeys are objects kube-apiserver writes outside the REST storage of a
// resource (pkg/controlplane/instance.go createLeaseReconciler,
// pkg/registry/core/rest/storage_core.go service allocators). The group/resource is
// the one the apiserver asks its storage factory for; the kind is what is stored.
var rawStorageKeys = []struct {
	segment string
	gr      schema.GroupResource
	kind    string
}{
	{"masterleases", schema.GroupResource{Resource: "apiServerIPInfo"}, "Endpoints"},
	// pkg/controlplane/apiserver/peer.go CreatePeerEndpointLeaseReconciler
	// (gate UnknownVersionInteroperabilityProxy).
	{"peerserverleases", schema.GroupResource{Resource: "apiServerPeerIPInfo"}, "Endpoints"},
	{"ranges/serviceips", schema.GroupResource{Resource: "serviceipallocations"}, "RangeAllocation"},
	{"ranges/secondaryserviceips", schema.GroupResource{Resource: "serviceipallocations"}, "RangeAllocation"},
	{"ranges/servicenodeports", schema.GroupResource{Resource: "servicenodeportallocations"}, "RangeAllocation"},
}

// Resolver maps etcd keys to group/resources the way kube-apiserver lays them out:
// /<prefix>/<resourcePrefix>[/<namespace>]/<name> for built-ins (with the apiserver's
// special prefixes such as "minions" and "services/specs") and
// /<prefix>/<group>/<plural>[/<namespace>]/<name> for custom resources.
type Resolver struct {
	prefix  string // "/registry", no trailing slash
	storage *StorageConfig

	mu sync.RWMutex
	// segments maps a resource prefix ("services/specs", "example.com/widgets") to
	// its group/resource; longest match wins.
	segments map[string]schema.GroupResource
	custom   map[schema.GroupResource]bool
	// aggregated are the API groups APIServices send to aggregated API servers.
	aggregated map[string]string
	byGR       map[schema.GroupResource]string
}

// NewResolver builds the key layout of kube-apiserver for the given etcd prefix.
func NewResolver(prefix string, storage *StorageConfig) *Resolver {
	r := &Resolver{
		prefix:   "/" + strings.Trim(prefix, "/"),
		storage:  storage,
		segments: map[string]schema.GroupResource{},
		custom:   map[schema.GroupResource]bool{},
		byGR:     map[schema.GroupResource]string{},
	}
	// Built-ins: where several group/resources share one prefix (cohabitation, e.g.
	// deployments.apps and deployments.extensions, events and events.events.k8s.io)
	// the key belongs to the one the storage version is in.
	for _, gr := range storage.BuiltinResources() {
		seg := storage.ResourcePrefix(gr)
		if prev, ok := r.segments[seg]; ok && r.owns(prev) && !r.owns(gr) {
			continue
		}
		r.segments[seg] = gr
	}
	for seg, gr := range r.segments {
		r.byGR[gr] = seg
	}
	for _, k := range rawStorageKeys {
		r.segments[k.segment] = k.gr
		if _, ok := r.byGR[k.gr]; !ok {
			r.byGR[k.gr] = k.segment
		}
	}
	return r
}

// owns reports whether gr is the group/resource its shared prefix is stored as.
func (r *Resolver) owns(gr schema.GroupResource) bool {
	c, err := r.storage.Codec(gr)
	if err != nil {
		return false
	}
	return c.StorageVersion.Group == gr.Group
}

// Prefix is the etcd prefix, e.g. "/registry".
func (r *Resolver) Prefix() string { return r.prefix }

// AddCustomResource registers the key layout of a CRD's custom resources.
func (r *Resolver) AddCustomResource(group, plural string) {
	gr := schema.GroupResource{Group: group, Resource: plural}
	seg := group + "/" + plural
	r.mu.Lock()
	defer r.mu.Unlock()
	r.segments[seg] = gr
	r.custom[gr] = true
	r.byGR[gr] = seg
}

// AddAggregatedGroup records that an APIService sends group to an aggregated
// API server (how says which: "APIService v1.NAME, service NS/SVC"): keys laid
// out under the group are not a deleted CRD's leftovers.
func (r *Resolver) AddAggregatedGroup(group, how string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.aggregated == nil {
		r.aggregated = map[string]string{}
	}
	if _, ok := r.aggregated[group]; !ok {
		r.aggregated[group] = how
	}
}

// IsCustom reports whether gr is a registered custom resource.
func (r *Resolver) IsCustom(gr schema.GroupResource) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.custom[gr]
}

// Resolve maps a key to its group/resource. Keys outside the prefix, and keys under
// it that are not API objects, give an *Error with ReasonNotObject; keys under the
// prefix that no built-in or registered CRD owns give ReasonOrphaned (the
// decoder refines the Orphan reason by what the key holds).
func (r *Resolver) Resolve(key string) (KeyInfo, error) {
	rest, ok := strings.CutPrefix(key, r.prefix)
	if ok {
		rest, ok = strings.CutPrefix(rest, "/")
	}
	if !ok {
		return KeyInfo{Key: key}, Errorf(key, ReasonNotObject, nil, "outside prefix %s", r.prefix)
	}
	if rest == "health" || rest == "" {
		return KeyInfo{Key: key}, Errorf(key, ReasonNotObject, nil, "health check key")
	}
	parts := strings.Split(rest, "/")
	r.mu.RLock()
	defer r.mu.RUnlock()
	// Raw-storage keys that are themselves the object: /registry/ranges/serviceips.
	for _, k := range rawStorageKeys {
		if rest == k.segment && strings.Contains(k.segment, "/") {
			return KeyInfo{Key: key, Resource: k.gr, Name: parts[len(parts)-1]}, nil
		}
	}
	// Longest resource prefix first: "services/endpoints" before "services".
	for n := min(len(parts)-1, 3); n >= 1; n-- {
		// parts[:n] joined by "/": the start of rest.
		end := n - 1
		for _, p := range parts[:n] {
			end += len(p)
		}
		seg := rest[:end]
		gr, ok := r.segments[seg]
		if !ok {
			continue
		}
		tail := parts[n:]
		info := KeyInfo{Key: key, Resource: gr, Custom: r.custom[gr]}
		switch len(tail) {
		case 1:
			info.Name = tail[0]
		case 2:
			info.Namespace, info.Name = tail[0], tail[1]
		default:
			return info, Errorf(key, ReasonUnknownResource, nil, "unexpected key layout under %s", seg)
		}
		if info.Name == "" {
			return info, Errorf(key, ReasonUnknownResource, nil, "empty name under %s", seg)
		}
		return info, nil
	}
	if len(parts) >= 3 && strings.Contains(parts[0], ".") {
		if svc, ok := r.aggregated[parts[0]]; ok {
			e := Errorf(key, ReasonOrphaned, nil, "no CRD %s.%s in this etcd, but the group is served by an aggregated API server (%s), which may store its objects here", parts[1], parts[0], svc)
			e.Orphan = OrphanAggregated
			return KeyInfo{Key: key}, e
		}
		e := Errorf(key, ReasonOrphaned, nil, "no CRD %s.%s in this etcd", parts[1], parts[0])
		e.Orphan = OrphanCRDMissing
		return KeyInfo{Key: key}, e
	}
	e := Errorf(key, ReasonOrphaned, nil, "no built-in resource or CRD is stored under %s/%s", r.prefix, parts[0])
	e.Orphan = OrphanUnknownPrefix
	return KeyInfo{Key: key}, e
}

// KindFor returns the internal kind stored for a raw-storage group/resource
// (masterleases, service range allocations), or "" for ordinary resources.
func KindFor(gr schema.GroupResource) string {
	for _, k := range rawStorageKeys {
		if k.gr == gr {
			return k.kind
		}
	}
	return ""
}

// ParseResource parses a --resource value: "secrets", "deployments.apps",
// "widgets.example.com". It must name a built-in resource or a registered CRD.
func (r *Resolver) ParseResource(s string) (schema.GroupResource, error) {
	gr := schema.ParseGroupResource(strings.ToLower(strings.TrimSpace(s)))
	r.mu.RLock()
	defer r.mu.RUnlock()
	if _, ok := r.byGR[gr]; ok {
		return gr, nil
	}
	// "deployments" alone: accept when exactly one group has it.
	if gr.Group == "" {
		var found []schema.GroupResource
		for cand := range r.byGR {
			if cand.Resource == gr.Resource {
				found = append(found, cand)
			}
		}
		if len(found) == 1 {
			return found[0], nil
		}
		if len(found) > 1 {
			names := make([]string, len(found))
			for i, f := range found {
				names[i] = f.String()
			}
			sort.Strings(names)
			return gr, &ResourceError{Name: s, Ambiguous: names}
		}
	}
	return gr, &ResourceError{Name: s}
}

// KeyPrefix gives the etcd key prefix (with a trailing slash) holding gr's objects,
// narrowed to one namespace when namespace is set.
func (r *Resolver) KeyPrefix(gr schema.GroupResource, namespace string) (string, error) {
	r.mu.RLock()
	seg, ok := r.byGR[gr]
	r.mu.RUnlock()
	if !ok {
		return "", fmt.Errorf("resource %s has no known etcd prefix", gr)
	}
	p := r.prefix + "/" + seg + "/"
	if namespace != "" {
		p += namespace + "/"
	}
	return p, nil
}

// CRDKeyPrefix is where CRD objects live.
func (r *Resolver) CRDKeyPrefix() string {
	return r.prefix + "/" + CRDGroupResource.Group + "/" + CRDGroupResource.Resource + "/"
}

// GuessResource names, for reports, the resource of a key that no resource owns:
// "/registry/example.com/widgets/ns/x" gives widgets.example.com, "/registry/foos/x"
// gives foos, anything else "(unknown)".
func GuessResource(prefix, key string) schema.GroupResource {
	rest := strings.TrimPrefix(key, strings.TrimSuffix(prefix, "/")+"/")
	parts := strings.Split(rest, "/")
	if len(parts) >= 3 && strings.Contains(parts[0], ".") {
		return schema.GroupResource{Group: parts[0], Resource: parts[1]}
	}
	if parts[0] == "" {
		return schema.GroupResource{Resource: "(unknown)"}
	}
	return schema.GroupResource{Resource: parts[0]}
}
