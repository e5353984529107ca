package decode

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/api/legacyscheme"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/release"
)

// Orphan says why no resource of this cluster owns an orphaned key.
type Orphan string

const (
	// OrphanRemovedBuiltin: the key holds an object of a kind kube-apiserver
	// no longer has, in one of its own API groups (a PodSecurityPolicy left
	// from 1.24).
	OrphanRemovedBuiltin Orphan = "removed-built-in"
	// OrphanCRDMissing: the key is laid out as a custom resource's
	// (/<prefix>/<group>/<plural>/...) and no CRD of that name is in etcd
	// (the CRD was deleted with its finalizer forced, or an uninstalled
	// aggregated API server stored its objects there).
	OrphanCRDMissing Orphan = "crd-missing"
	// OrphanUnknownPrefix: nothing kube-apiserver stores, nor any CRD, uses
	// the key's prefix.
	OrphanUnknownPrefix Orphan = "unknown-prefix"
	// OrphanAggregated: laid out as a custom resource's, no CRD of that name,
	// but an APIService in etcd sends the group to an aggregated API server
	// (a Service): that server may store its objects here and still use them.
	// kube-apiserver does not read them either, so they block nothing; but
	// they are never removed as leftovers (quarantine keeps them).
	OrphanAggregated Orphan = "aggregated-api"
)

// classifyOrphan refines the resolver's verdict on a key no resource owns by
// what the key holds. kube-apiserver never reads such a key: it reads only the
// prefixes of the resources it serves. The stored apiVersion/kind is read only
// from a value that is not encrypted (an orphan is never decrypted: no
// configured provider is known to be its).
//
// A removed built-in is recognised by its group: kube-apiserver's own schemes
// still register the group and not the kind (the 1.37 storage factory keeps
// PodSecurityPolicies only as a cohabitation entry, not the "podsecuritypolicy"
// key prefix 1.24 stored them under, so the key itself says nothing). An
// object of a kind kube-apiserver serves, under a prefix it does not read, is
// not orphaned but unknown-resource: it looks like a live object stored
// somewhere unexpected, and is never offered for removal as a leftover.
func classifyOrphan(obj *Object, e *Error) *Error {
	value := obj.KV.Value
	if e.Reason != ReasonOrphaned || strings.HasPrefix(string(value), encryption.EncryptedPrefix) {
		return e
	}
	gvk, mt, err := StoredGVK(e.Key, value)
	if err != nil || gvk.Kind == "" {
		return e
	}
	obj.StoredGVK, obj.MediaType = gvk, mt
	scheme := schemeOfGroup(gvk.Group)
	if scheme == nil {
		if e.Orphan == OrphanCRDMissing {
			e.Detail += fmt.Sprintf(" (holds %s %s)", gvk.GroupVersion(), gvk.Kind)
		}
		return e
	}
	if scheme.Recognizes(gvk) {
		return Errorf(e.Key, ReasonUnknownResource, nil, "holds %s %s, a kind kube-apiserver %s serves, under a prefix none of its resources is stored under", gvk.GroupVersion(), gvk.Kind, release.Linked())
	}
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	e.Orphan = OrphanRemovedBuiltin
	e.Detail = fmt.Sprintf("%s %s (%s): kube-apiserver %s has no such resource", gvk.GroupVersion(), gvk.Kind, plural.GroupResource(), release.Linked())
	return e
}

// schemeOfGroup returns the kube-apiserver scheme that registers an API group
// (kube-apiserver's own, apiextensions' or the aggregator's), or nil.
func schemeOfGroup(group string) interface {
	Recognizes(schema.GroupVersionKind) bool
} {
	switch {
	case legacyscheme.Scheme.IsGroupRegistered(group):
		return legacyscheme.Scheme
	case ExtensionsScheme.IsGroupRegistered(group):
		return ExtensionsScheme
	case AggregatorScheme.IsGroupRegistered(group):
		return AggregatorScheme
	}
	return nil
}

// OrphanGroup counts the orphaned keys of one reason under one key prefix.
type OrphanGroup struct {
	Reason Orphan `json:"reason"`
	// Prefix is the key prefix the keys share: /registry/podsecuritypolicy/,
	// /registry/example.com/widgets/.
	Prefix string `json:"prefix"`
	Keys   int64  `json:"keys"`
	Bytes  int64  `json:"bytes"`
	// Detail is the first key's: which kind it holds, which CRD is missing.
	Detail     string   `json:"detail,omitempty"`
	SampleKeys []string `json:"sampleKeys"`
}

// Orphans tallies orphaned keys by reason and prefix for reports, with up to
// Show sample keys each. The zero value lists no key.
type Orphans struct {
	Show   int
	Total  int64
	groups map[[2]string]*OrphanGroup
}

// Add counts one orphaned key (e's reason is ReasonOrphaned) of size bytes.
func (o *Orphans) Add(prefix string, e *Error, size int) {
	if o.groups == nil {
		o.groups = map[[2]string]*OrphanGroup{}
	}
	p := orphanPrefix(prefix, e)
	k := [2]string{string(e.Orphan), p}
	g := o.groups[k]
	if g == nil {
		g = &OrphanGroup{Reason: e.Orphan, Prefix: p, Detail: e.Detail, SampleKeys: []string{}}
		o.groups[k] = g
	}
	g.Keys++
	g.Bytes += int64(size)
	o.Total++
	if len(g.SampleKeys) < o.Show {
		g.SampleKeys = append(g.SampleKeys, e.Key)
	}
}

// Groups are the tallies, by reason then prefix.
func (o *Orphans) Groups() []OrphanGroup {
	out := make([]OrphanGroup, 0, len(o.groups))
	for _, g := range o.groups {
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Reason != out[j].Reason {
			return out[i].Reason < out[j].Reason
		}
		return out[i].Prefix < out[j].Prefix
	})
	return out
}

// orphanPrefix is the directory an orphaned key is grouped under: its first
// two segments when laid out as a custom resource's, else its first one.
func orphanPrefix(prefix string, e *Error) string {
	prefix = strings.TrimSuffix(prefix, "/")
	rest := strings.TrimPrefix(e.Key, prefix+"/")
	parts := strings.Split(rest, "/")
	n := 1
	if e.Orphan == OrphanCRDMissing && len(parts) >= 3 {
		n = 2
	}
	if len(parts) <= n {
		return e.Key
	}
	return prefix + "/" + strings.Join(parts[:n], "/") + "/"
}
