// Package verify is the read-only audit of an etcd keyspace against a target
// kube-apiserver release: it runs every object through reencode's decision (the
// same one migrate acts on) without writing anything, and reports per resource what
// is current, stale (and why) or unreadable (and why), the orphaned keys no
// resource of the cluster owns (by reason, apart: they do not fail the gate unless
// asked), whether CRD storedVersions can be trimmed, and an exit code a runbook
// can gate on. It reports keys and reasons only, never values.
package verify

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// DefaultShowKeys is how many keys of each class are listed per resource when
// Options.ShowKeys is 0.
const DefaultShowKeys = 5

// Exit codes of a verify run.
const (
	ExitCurrent    = 0
	ExitStale      = 3
	ExitUnreadable = 4
)

// Options tune a verify run.
type Options struct {
	// ShowKeys is how many keys of each class (stale, unreadable) are listed per
	// resource: 0 means DefaultShowKeys, a negative value lists none.
	ShowKeys int
	// FailOnOrphaned makes orphaned keys fail the gate as unreadable objects
	// do (exit 4): a strict audit (--fail-on-orphaned).
	FailOnOrphaned bool
}

// Counts are object counts by verdict. Objects = Current + Stale + Unreadable;
// NotObjects (compact_rev_key, health, ...) and Orphaned (keys no resource of
// the cluster owns) are counted apart.
type Counts struct {
	Objects    int64 `json:"objects"`
	Current    int64 `json:"current"`
	Stale      int64 `json:"stale"`
	Unreadable int64 `json:"unreadable"`
	NotObjects int64 `json:"notObjects,omitempty"`
	Orphaned   int64 `json:"orphaned,omitempty"`
	// Reencode counts objects (included in Current) stored in the target version,
	// media type and encryption key whose bytes kube-apiserver would nonetheless
	// write differently (defaults it applies on read, e.g. Jobs, PVCs): migrate
	// rewrites them, as a no-op update through the apiserver would, but they do
	// not fail the gate.
	Reencode int64 `json:"reencode,omitempty"`
}

// KeyLine is one listed key: for a stale key From, To and Reasons; for an
// unreadable key Reason and Detail (and From as far as it was read).
type KeyLine struct {
	Key     string            `json:"key"`
	From    *reencode.Form    `json:"from,omitempty"`
	To      *reencode.Form    `json:"to,omitempty"`
	Reasons []reencode.Reason `json:"reasons,omitempty"`
	Reason  decode.Reason     `json:"reason,omitempty"`
	Detail  string            `json:"detail,omitempty"`
	// Dropped names the fields a stale custom resource's rewrite drops
	// (reencode.Decision.Dropped): paths, never values.
	Dropped []string `json:"dropped,omitempty"`
}

// ResourceReport is the verdict for one group/resource.
type ResourceReport struct {
	Group    string `json:"group"`
	Resource string `json:"resource"`
	Counts
	// StaleBy counts stale objects by reason (an object may have several).
	StaleBy map[reencode.Reason]int `json:"staleBy,omitempty"`
	// UnreadableBy counts unreadable objects by reason.
	UnreadableBy   map[decode.Reason]int `json:"unreadableBy,omitempty"`
	StaleKeys      []KeyLine             `json:"staleKeys,omitempty"`
	UnreadableKeys []KeyLine             `json:"unreadableKeys,omitempty"`
	// TargetMediaType is the media type the target kube-apiserver stores this
	// resource in (protobuf, json or yaml for built-ins per --storage-media-type;
	// json for CRDs and APIServices; json, or cbor with the CBORServingAndStorage
	// gate, for custom resources). Empty when no object of it was readable.
	TargetMediaType string `json:"targetMediaType,omitempty"`
	// StaleMediaTypes counts the objects stale by media type by the media type
	// they are stored in (protobuf, json, yaml, cbor).
	StaleMediaTypes map[string]int `json:"staleMediaTypes,omitempty"`
}

// Name is the resource as kubectl names it: "secrets", "deviceclasses.resource.k8s.io".
func (r ResourceReport) Name() string {
	return schema.GroupResource{Group: r.Group, Resource: r.Resource}.String()
}

// CRDStatus says whether a CRD's status.storedVersions can be trimmed to its
// storage version.
type CRDStatus struct {
	Name           string   `json:"name"`
	Group          string   `json:"group"`
	Resource       string   `json:"resource"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
	// Objects is how many of the CRD's custom resources this run saw.
	Objects int64 `json:"objects"`
	// ObjectsNotInStorageVersion counts objects not stored in the storage version
	// (or unreadable, so not known to be).
	ObjectsNotInStorageVersion int64 `json:"objectsNotInStorageVersion"`
	// Trimmable: storedVersions lists other versions than the storage version, and
	// every object of the CRD is current and stored in the storage version.
	Trimmable bool `json:"trimmable"`
	// Note explains the verdict in one sentence; empty when Unjudged says
	// why the run could not tell (the command layer says it in words).
	Note string `json:"note"`
	// Unjudged names the filter of the run that left the CRD's objects
	// (partly) unscanned, so that nothing can be said of trimming.
	Unjudged Narrowed `json:"-"`
}

// Narrowed is a filter of the run that narrows the keyspace scanned.
type Narrowed string

const (
	// NarrowedResources: the resources scanned leave this one out.
	NarrowedResources Narrowed = "resources"
	// NarrowedNamespace: one namespace was scanned.
	NarrowedNamespace Narrowed = "namespace"
)

// Report is the outcome of a verify run.
type Report struct {
	Revision   int64              `json:"revision"`
	Consistent bool               `json:"consistent"`
	Restarts   []etcdscan.Restart `json:"restarts,omitempty"`
	Target     string             `json:"target"`
	// EncryptionOnly: only the encryption was judged (--encryption-only).
	EncryptionOnly bool             `json:"encryptionOnly,omitempty"`
	Prefixes       []string         `json:"prefixes"`
	Namespace      string           `json:"namespace,omitempty"`
	Summary        Counts           `json:"summary"`
	Resources      []ResourceReport `json:"resources"`
	CRDs           []CRDStatus      `json:"crds"`
	// FieldLoss lists, per custom resource and stored version, the fields
	// the rewrite drops (the stored version's schema has them, the storage
	// version's prunes them, as kube-apiserver's next write would) and how
	// many objects carry each: paths and counts, never values.
	FieldLoss []reencode.FieldLoss `json:"fieldLoss,omitempty"`
	// Orphaned are the keys no built-in resource or CRD of the cluster owns,
	// by reason and prefix, with sample keys (Summary.Orphaned counts them).
	// kube-apiserver never reads them; they fail the gate only with
	// FailOnOrphaned.
	Orphaned       []decode.OrphanGroup `json:"orphaned,omitempty"`
	FailOnOrphaned bool                 `json:"failOnOrphaned,omitempty"`
	// Encryption counts the objects by the encryption provider and key they
	// are stored under, and where that stands in the configuration (first,
	// later, or none decrypts it): which keys the keyspace still needs.
	Encryption []EncryptionCount `json:"encryption,omitempty"`
	// Warnings are the environment's (pipeline.Env.Warnings, e.g. a KMS
	// plugin that does not work), also printed on stderr: a runbook reading
	// the report sees why objects are unreadable.
	Warnings []string `json:"warnings,omitempty"`
	// Alarms are etcd's active alarms ("NOSPACE on member ..."): under one,
	// etcd refuses every write of every client, kube-apiserver's included.
	Alarms     []string `json:"alarms,omitempty"`
	ShowKeys   int      `json:"-"`
	byResource map[string]*ResourceReport
	orphans    decode.Orphans
	encryption map[encryptionKey]int64
	fieldLoss  reencode.FieldLosses
}

// Run audits the keyspace the environment selects at one revision
// (env.Config.Revision, or the current one). It never writes to etcd.
func Run(ctx context.Context, env *pipeline.Env, opts Options) (*Report, error) {
	if env == nil {
		return nil, errors.New("verify: no environment")
	}
	show := opts.ShowKeys
	if show == 0 {
		show = DefaultShowKeys
	}
	if show < 0 {
		show = 0
	}
	r := &Report{
		Target:         Target(env),
		EncryptionOnly: env.Planner != nil && env.Planner.EncryptionOnly,
		Prefixes:       append([]string(nil), env.Prefixes...),
		Namespace:      env.Config.Namespace,
		Warnings:       append([]string(nil), env.Warnings...),
		ShowKeys:       show,
		byResource:     map[string]*ResourceReport{},
		orphans:        decode.Orphans{Show: show},

		FailOnOrphaned: opts.FailOnOrphaned,
	}
	// A snapshot file read in place has no etcd behind it, so no alarm.
	if env.Client != nil {
		if alarms, err := etcdscan.Alarms(ctx, env.Client); err != nil {
			r.Warnings = append(r.Warnings, "could not list etcd's alarms: "+err.Error())
		} else {
			r.Alarms = alarms
		}
	}
	crds := newCRDTally(env)
	stats, err := env.Run(ctx, env.Config.Revision, pipeline.Classify, func(page []reencode.Decision) error {
		for i := range page {
			r.add(env, &page[i])
			crds.add(&page[i])
		}
		return nil
	})
	r.Revision, r.Consistent, r.Restarts = stats.Revision, stats.Consistent, stats.Restarts
	if err != nil {
		return nil, fmt.Errorf("verify: scan %s: %w", strings.Join(env.Prefixes, ", "), err)
	}
	r.Resources = make([]ResourceReport, 0, len(r.byResource))
	for _, rr := range r.byResource {
		r.Resources = append(r.Resources, *rr)
	}
	sort.Slice(r.Resources, func(i, j int) bool { return r.Resources[i].Name() < r.Resources[j].Name() })
	r.byResource = nil
	r.Orphaned = r.orphans.Groups()
	r.Encryption, r.encryption = r.encryptionCounts(), nil
	r.CRDs = crds.statuses()
	r.FieldLoss = r.fieldLoss.List()
	return r, nil
}

// Target names the release and media type decisions are made for, and where
// the release came from, e.g. "kube-apiserver 1.37 (protobuf; release from the
// manifest image)" or "kube-apiserver 1.37 (protobuf; release assumed: nothing
// said which the cluster runs)"; with the CBORServingAndStorage gate on, the
// media type reads "protobuf, custom resources cbor".
func Target(env *pipeline.Env) string {
	if env.Target == nil {
		return "kube-apiserver"
	}
	rel := env.Target.Release()
	name := "kube-apiserver " + rel.String()
	if emulated := rel.Emulated(); emulated != nil {
		name += " emulating " + emulated.String()
	}
	src := "release assumed: nothing said which the cluster runs"
	if env.Target.Named() {
		src = "release from the " + string(env.Target.ReleaseFrom())
	}
	media := decode.ShortMediaType(env.Target.Storage().MediaType())
	if mt, err := customresource.StorageMediaType(); err == nil && mt != customresource.MediaTypeJSON {
		media += ", custom resources " + mt
	}
	scope := ""
	if env.Planner != nil && env.Planner.EncryptionOnly {
		scope = "; encryption only"
	}
	return fmt.Sprintf("%s (%s; %s%s)", name, media, src, scope)
}

func (r *Report) add(env *pipeline.Env, d *reencode.Decision) {
	if d.Status == reencode.NotObject {
		r.Summary.NotObjects++
		return
	}
	if d.Status == reencode.Orphaned && d.Err != nil {
		r.Summary.Orphaned++
		r.orphans.Add(env.Resolver.Prefix(), d.Err, d.OldSize)
		return
	}
	r.addEncryption(env, d)
	gr := d.Resource
	if gr.Resource == "" {
		gr = decode.GuessResource(env.Resolver.Prefix(), d.Key)
	}
	name := gr.String()
	rr := r.byResource[name]
	if rr == nil {
		rr = &ResourceReport{Group: gr.Group, Resource: gr.Resource}
		r.byResource[name] = rr
	}
	rr.Objects++
	r.Summary.Objects++
	if (d.Status == reencode.Current || d.Status == reencode.Stale) && d.To.MediaType != "" {
		rr.TargetMediaType = d.To.MediaType
	}
	switch d.Status {
	case reencode.Current:
		rr.Current++
		r.Summary.Current++
	case reencode.Stale:
		r.fieldLoss.Add(d)
		if len(d.Reasons) == 1 && d.Reasons[0] == reencode.ReasonEncoding {
			rr.Current++
			r.Summary.Current++
			rr.Reencode++
			r.Summary.Reencode++
			return
		}
		rr.Stale++
		r.Summary.Stale++
		if rr.StaleBy == nil {
			rr.StaleBy = map[reencode.Reason]int{}
		}
		for _, reason := range d.Reasons {
			rr.StaleBy[reason]++
			if reason == reencode.ReasonMediaType {
				if rr.StaleMediaTypes == nil {
					rr.StaleMediaTypes = map[string]int{}
				}
				rr.StaleMediaTypes[d.From.MediaType]++
			}
		}
		if len(rr.StaleKeys) < r.ShowKeys {
			from, to := d.From, d.To
			rr.StaleKeys = append(rr.StaleKeys, KeyLine{Key: d.Key, From: &from, To: &to, Reasons: append([]reencode.Reason(nil), d.Reasons...), Dropped: d.Dropped})
		}
	default:
		// Unreadable, or anything a newer pipeline may add that is not a verdict
		// of current or stale: never count it as fine.
		rr.Unreadable++
		r.Summary.Unreadable++
		reason, detail := d.ErrorReason()
		if rr.UnreadableBy == nil {
			rr.UnreadableBy = map[decode.Reason]int{}
		}
		rr.UnreadableBy[reason]++
		if len(rr.UnreadableKeys) < r.ShowKeys {
			line := KeyLine{Key: d.Key, Reason: reason, Detail: detail}
			if d.From != (reencode.Form{}) {
				from := d.From
				line.From = &from
			}
			rr.UnreadableKeys = append(rr.UnreadableKeys, line)
		}
	}
}

// ExitCode is 0 when every object is current, 3 when something is stale but
// everything is readable, 4 when something is unreadable (stale or not), or
// with FailOnOrphaned when a key is orphaned. Orphaned keys alone do not
// change it otherwise.
func (r *Report) ExitCode() int {
	switch {
	case r.Summary.Unreadable > 0, r.FailOnOrphaned && r.Summary.Orphaned > 0:
		return ExitUnreadable
	case r.Summary.Stale > 0:
		return ExitStale
	}
	return ExitCurrent
}

// crdTally follows the objects of each CRD during the run.
type crdTally struct {
	env  *pipeline.Env
	byGR map[schema.GroupResource]*crdCount
}

type crdCount struct {
	crd                 *pipeline.CRD
	objects             int64
	notInStorage        int64
	notCurrent          int64
	storageGroupVersion string
}

func newCRDTally(env *pipeline.Env) *crdTally {
	t := &crdTally{env: env, byGR: map[schema.GroupResource]*crdCount{}}
	for _, c := range env.CRDs {
		t.byGR[c.Resource] = &crdCount{crd: c, storageGroupVersion: schema.GroupVersion{Group: c.Resource.Group, Version: c.StorageVersion}.String()}
	}
	return t
}

func (t *crdTally) add(d *reencode.Decision) {
	c := t.byGR[d.Resource]
	if c == nil {
		return
	}
	c.objects++
	if d.Status != reencode.Current {
		c.notCurrent++
	}
	if d.Status == reencode.Unreadable || d.From.Version != c.storageGroupVersion {
		c.notInStorage++
	}
}

func (t *crdTally) statuses() []CRDStatus {
	out := make([]CRDStatus, 0, len(t.byGR))
	for _, c := range t.byGR {
		crd := c.crd
		name := crd.Resource.Resource + "." + crd.Resource.Group
		if crd.Object != nil && crd.Object.Name != "" {
			name = crd.Object.Name
		}
		s := CRDStatus{
			Name:                       name,
			Group:                      crd.Resource.Group,
			Resource:                   crd.Resource.Resource,
			StorageVersion:             crd.StorageVersion,
			StoredVersions:             append([]string{}, crd.StoredVersions...),
			Objects:                    c.objects,
			ObjectsNotInStorageVersion: c.notInStorage,
		}
		extra := false
		for _, v := range crd.StoredVersions {
			if v != crd.StorageVersion {
				extra = true
			}
		}
		scanned := t.env.Filter == nil || t.env.Filter[crd.Resource]
		switch {
		case !extra:
			s.Note = "storedVersions lists only the storage version: nothing to trim"
		case crd.Err != nil:
			s.Note = "its custom resources could not be read: " + crd.Err.Error()
		case !scanned:
			s.Unjudged = NarrowedResources
		case t.env.Config.Namespace != "":
			s.Unjudged = NarrowedNamespace
		case c.notInStorage > 0:
			s.Note = fmt.Sprintf("%d object(s) not (known to be) stored in %s: migrate them first", c.notInStorage, c.storageGroupVersion)
		case c.notCurrent > 0:
			s.Note = fmt.Sprintf("%d object(s) in %s are still stale (encryption or encoding): migrate them first", c.notCurrent, c.storageGroupVersion)
		default:
			s.Trimmable = true
			s.Note = fmt.Sprintf("every object is stored in %s: status.storedVersions can be trimmed to [%s]", c.storageGroupVersion, crd.StorageVersion)
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
