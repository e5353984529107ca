// Package inventory owns the read-only census of an etcd keyspace (the inventory
// command: per resource the object count, bytes, stored versions, media types,
// encryption providers and keys, leases and unreadable objects by reason; the
// orphaned keys no resource of the cluster owns, apart, by reason) and the
// inspect command (one key decoded, with its storage header, Secret data redacted).
// It never writes to etcd and prints nothing: it returns report values (the
// command layer prints them), with no plaintext it was not asked for.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// Defaults of Options.
const (
	DefaultShowKeys   = 5
	DefaultNotObjects = 100
)

// unknown labels a breakdown entry that could not be read (the object is unreadable
// before that point), so that every breakdown adds up to Count.
const unknown = "(unknown)"

// Options tune a census.
type Options struct {
	// ShowKeys is how many unreadable keys are listed per resource: 0 means
	// DefaultShowKeys, a negative value lists none.
	ShowKeys int
	// MaxNotObjects bounds the keys that are not objects listed (all are counted):
	// 0 means DefaultNotObjects, a negative value lists none.
	MaxNotObjects int
}

// Key is one listed key: an unreadable object or a key that is not an object.
type Key struct {
	Key    string        `json:"key"`
	Bytes  int64         `json:"bytes"`
	Reason decode.Reason `json:"reason"`
	Detail string        `json:"detail,omitempty"`
}

// Resource is the census of one group/resource. Versions, MediaTypes and
// Encryption each add up to Count; what could not be read is "(unknown)".
type Resource struct {
	Group    string `json:"group"`
	Resource string `json:"resource"`
	Count    int64  `json:"count"`
	// Bytes is the sum of the stored values' sizes (as stored, encrypted or not);
	// MaxBytes the largest one.
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"maxBytes"`
	// Versions counts objects by stored apiVersion ("v1", "apps/v1").
	Versions map[string]int64 `json:"versions"`
	// MediaTypes counts objects by stored media type (protobuf, json, cbor).
	MediaTypes map[string]int64 `json:"mediaTypes"`
	// Encryption counts objects by provider:key name ("identity", "aescbc:key1").
	Encryption map[string]int64 `json:"encryption"`
	// WithLease counts keys attached to an etcd lease (events).
	WithLease int64 `json:"withLease"`
	// Unreadable counts objects that could not be decoded, UnreadableBy by reason.
	Unreadable     int64                   `json:"unreadable"`
	UnreadableBy   map[decode.Reason]int64 `json:"unreadableBy,omitempty"`
	UnreadableKeys []Key                   `json:"unreadableKeys,omitempty"`
}

// Name is the resource as kubectl names it: "secrets", "deployments.apps".
func (r *Resource) Name() string {
	return schema.GroupResource{Group: r.Group, Resource: r.Resource}.String()
}

// Totals add up every resource.
type Totals struct {
	Keys       int64 `json:"keys"`
	Objects    int64 `json:"objects"`
	Bytes      int64 `json:"bytes"`
	WithLease  int64 `json:"withLease"`
	Unreadable int64 `json:"unreadable"`
	NotObjects int64 `json:"notObjects"`
	// Orphaned counts keys no built-in resource or CRD owns (not objects of
	// any resource: counted apart from Objects).
	Orphaned int64 `json:"orphaned"`
}

// Inventory is the census of the keys a run selected, read at one revision.
type Inventory struct {
	Revision int64 `json:"revision"`
	// Consistent is false when the revision was compacted during the scan and the
	// scan continued at a newer one (Restarts).
	Consistent bool               `json:"consistent"`
	Restarts   []etcdscan.Restart `json:"restarts,omitempty"`
	Prefixes   []string           `json:"prefixes"`
	Namespace  string             `json:"namespace,omitempty"`
	Total      Totals             `json:"total"`
	Resources  []*Resource        `json:"resources"`
	// NotObjects lists keys under the prefix that are not API objects
	// (/registry/health, ...), up to Options.MaxNotObjects; Total.NotObjects counts all.
	NotObjects []Key `json:"notObjects"`
	// Orphaned are the orphaned keys by reason and prefix, with sample keys.
	Orphaned []decode.OrphanGroup `json:"orphaned"`

	// ShowKeys is how many unreadable keys are listed per resource.
	ShowKeys int `json:"-"`

	orphans       decode.Orphans
	maxNotObjects int
	byResource    map[schema.GroupResource]*Resource
}

// Run takes the census of the keys env selects, at one revision
// (env.Config.Revision, or the current one). progress, when
// not nil, is called after each page with the number of keys processed so far.
func Run(ctx context.Context, env *pipeline.Env, opts Options, progress func(n int64)) (*Inventory, error) {
	if env == nil {
		return nil, errors.New("inventory: no environment")
	}
	inv := &Inventory{
		Prefixes:      append([]string{}, env.Prefixes...),
		Namespace:     env.Config.Namespace,
		Resources:     []*Resource{},
		NotObjects:    []Key{},
		ShowKeys:      bound(opts.ShowKeys, DefaultShowKeys),
		maxNotObjects: bound(opts.MaxNotObjects, DefaultNotObjects),
		orphans:       decode.Orphans{Show: bound(opts.ShowKeys, DefaultShowKeys)},
		byResource:    map[schema.GroupResource]*Resource{},
	}
	prefix := env.Resolver.Prefix()
	stats, err := env.Run(ctx, env.Config.Revision, pipeline.DecodeOnly, func(page []reencode.Decision) error {
		for i := range page {
			inv.add(prefix, &page[i])
		}
		if progress != nil {
			progress(inv.Total.Keys)
		}
		return nil
	})
	inv.Revision, inv.Consistent, inv.Restarts = stats.Revision, stats.Consistent, stats.Restarts
	if err != nil {
		return nil, fmt.Errorf("inventory: scan %s: %w", strings.Join(env.Prefixes, ", "), err)
	}
	for _, r := range inv.byResource {
		inv.Resources = append(inv.Resources, r)
	}
	sort.Slice(inv.Resources, func(i, j int) bool { return inv.Resources[i].Name() < inv.Resources[j].Name() })
	inv.Orphaned = inv.orphans.Groups()
	return inv, nil
}

func bound(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

func (inv *Inventory) add(prefix string, d *reencode.Decision) {
	inv.Total.Keys++
	size := int64(d.OldSize)
	if d.Status == reencode.NotObject {
		inv.Total.NotObjects++
		if len(inv.NotObjects) < inv.maxNotObjects {
			k := Key{Key: d.Key, Bytes: size, Reason: decode.ReasonNotObject}
			if d.Err != nil {
				k.Detail = d.Err.Detail
			}
			inv.NotObjects = append(inv.NotObjects, k)
		}
		return
	}
	if d.Status == reencode.Orphaned && d.Err != nil {
		inv.Total.Orphaned++
		inv.orphans.Add(prefix, d.Err, d.OldSize)
		return
	}
	gr := d.Resource
	if gr.Resource == "" {
		gr = decode.GuessResource(prefix, d.Key)
	}
	r := inv.byResource[gr]
	if r == nil {
		r = &Resource{Group: gr.Group, Resource: gr.Resource, Versions: map[string]int64{}, MediaTypes: map[string]int64{}, Encryption: map[string]int64{}}
		inv.byResource[gr] = r
	}
	r.Count++
	r.Bytes += size
	r.MaxBytes = max(r.MaxBytes, size)
	r.Versions[orUnknown(d.From.Version)]++
	r.MediaTypes[orUnknown(d.From.MediaType)]++
	r.Encryption[orUnknown(d.From.Encryption)]++
	inv.Total.Objects++
	inv.Total.Bytes += size
	if d.Lease != 0 {
		r.WithLease++
		inv.Total.WithLease++
	}
	if d.Status == reencode.Readable {
		return
	}
	// Unreadable, or any status that is not "read fine".
	r.Unreadable++
	inv.Total.Unreadable++
	reason, detail := d.ErrorReason()
	if r.UnreadableBy == nil {
		r.UnreadableBy = map[decode.Reason]int64{}
	}
	r.UnreadableBy[reason]++
	if len(r.UnreadableKeys) < inv.ShowKeys {
		r.UnreadableKeys = append(r.UnreadableKeys, Key{Key: d.Key, Bytes: size, Reason: reason, Detail: detail})
	}
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}
