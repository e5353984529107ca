package reencode

import (
	"sort"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// MaxFieldLossPaths bounds the distinct field paths a FieldLoss lists; the
// objects that drop other paths still count in Objects, and FieldsNotListed
// counts those (object, path) pairs.
const MaxFieldLossPaths = 100

// FieldLoss is what rewriting the custom resources of one resource stored in
// one version drops (Decision.Dropped): the fields of that version's schema
// the storage version's prunes, and how many objects carry each. Paths only,
// never values. kube-apiserver's next write of those objects drops the same
// fields; until then they are still in etcd, though no read through the
// storage version shows them.
type FieldLoss struct {
	Group    string `json:"group"`
	Resource string `json:"resource"`
	// StoredVersion is the version the objects are stored in,
	// StorageVersion the one they are rewritten to.
	StoredVersion  string `json:"storedVersion"`
	StorageVersion string `json:"storageVersion"`
	// Objects counts the objects that lose at least one field.
	Objects int64 `json:"objects"`
	// FirstKey is one of them.
	FirstKey string       `json:"firstKey"`
	Fields   []FieldCount `json:"fields"`
	// FieldsNotListed counts the (object, path) pairs beyond the first
	// MaxFieldLossPaths distinct paths.
	FieldsNotListed int64 `json:"fieldsNotListed,omitempty"`
}

// FieldCount is one dropped field and how many objects carry it.
type FieldCount struct {
	Path    string `json:"path"`
	Objects int64  `json:"objects"`
}

// Name is the resource as kubectl names it.
func (f FieldLoss) Name() string {
	return schema.GroupResource{Group: f.Group, Resource: f.Resource}.String()
}

// FieldLosses tallies Decision.Dropped per resource and stored version. It is
// not safe for concurrent use.
type FieldLosses struct {
	by map[fieldLossKey]*fieldLossTally
}

type fieldLossKey struct {
	gr     schema.GroupResource
	stored string
}

type fieldLossTally struct {
	FieldLoss
	paths map[string]int64
}

// Add counts d's dropped fields; a decision that drops nothing is ignored.
func (t *FieldLosses) Add(d *Decision) {
	if len(d.Dropped) == 0 {
		return
	}
	if t.by == nil {
		t.by = map[fieldLossKey]*fieldLossTally{}
	}
	k := fieldLossKey{gr: d.Resource, stored: versionOf(d.From.Version)}
	e := t.by[k]
	if e == nil {
		e = &fieldLossTally{FieldLoss: FieldLoss{
			Group: d.Resource.Group, Resource: d.Resource.Resource,
			StoredVersion: k.stored, StorageVersion: versionOf(d.To.Version), FirstKey: d.Key,
		}, paths: map[string]int64{}}
		t.by[k] = e
	}
	e.Objects++
	for _, p := range d.Dropped {
		if _, ok := e.paths[p]; !ok && len(e.paths) >= MaxFieldLossPaths {
			e.FieldsNotListed++
			continue
		}
		e.paths[p]++
	}
}

// List is the tally by resource name and stored version, each one's fields by
// path.
func (t *FieldLosses) List() []FieldLoss {
	out := make([]FieldLoss, 0, len(t.by))
	for _, e := range t.by {
		f := e.FieldLoss
		f.Fields = make([]FieldCount, 0, len(e.paths))
		for p, n := range e.paths {
			f.Fields = append(f.Fields, FieldCount{Path: p, Objects: n})
		}
		sort.Slice(f.Fields, func(i, j int) bool { return f.Fields[i].Path < f.Fields[j].Path })
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name() != out[j].Name() {
			return out[i].Name() < out[j].Name()
		}
		return out[i].StoredVersion < out[j].StoredVersion
	})
	if len(out) == 0 {
		return nil
	}
	return out
}

// versionOf is the version of "group/version" (or of "version").
func versionOf(gv string) string {
	v, err := schema.ParseGroupVersion(gv)
	if err != nil {
		return gv
	}
	return v.Version
}
