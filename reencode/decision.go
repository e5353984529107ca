package reencode

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
)

// Status is the verdict on one key.
type Status string

const (
	Current    Status = "current"
	Stale      Status = "stale"
	Unreadable Status = "unreadable"
	NotObject  Status = "not-an-object"
	// Orphaned: no resource of this cluster owns the key (decode.ReasonOrphaned);
	// kube-apiserver never reads it, so it is neither rewritten nor unreadable.
	Orphaned Status = "orphaned"
	// Readable is Describe's verdict on a decoded object: no decision was asked for.
	Readable Status = "readable"
)

// Reason says why a stale object needs a rewrite.
type Reason string

const (
	ReasonVersion    Reason = "storage-version"
	ReasonEncryption Reason = "encryption"
	ReasonMediaType  Reason = "media-type"
	// ReasonEncoding: same version, media type and key, but the apiserver would
	// write different bytes (defaulting added fields, an older field order, ...).
	ReasonEncoding Reason = "encoding"
	// ReasonManagedFields: kube-apiserver's field manager would change
	// managedFields on a no-op update (entries for versions it no longer
	// serves, more than ten update managers, undecodable entries; for a
	// custom resource, all of them once one names a version its CRD no
	// longer lists).
	ReasonManagedFields Reason = "managed-fields"
)

// Form describes how an object is (or would be) stored.
type Form struct {
	Version    string `json:"version"`
	MediaType  string `json:"mediaType"`
	Encryption string `json:"encryption"`
}

// Decision is the outcome for one key. NewValue holds the encrypted bytes to write
// when Status is Stale; it is never printed.
//
// AppendSpooled and ReadSpooled (spooled.go) keep each field by hand: a
// field added here, or to a type it holds, is added there too
// (TestDecisionSpooledReadsBack fails until it is).
type Decision struct {
	Key      string
	Resource schema.GroupResource
	Status   Status
	Reasons  []Reason
	From, To Form
	// Err is set for Unreadable, NotObject and Orphaned.
	Err *decode.Error
	// Dropped, for a stale custom resource, names the fields (paths, never
	// values) the rewrite drops: fields of the version it is stored in that
	// the storage version's schema prunes after conversion (a field an old
	// version had, under conversion None). kube-apiserver's next write of
	// the object drops the same ones; the journal keeps the original.
	Dropped []string

	ModRevision int64
	Lease       int64
	// Read is the rest of what the key was read with (create revision,
	// version, lease, sub-revision): what an output snapshot's writer keeps.
	Read    etcdscan.KVMeta
	OldSize int
	// OldValue is the stored value as read (still encrypted if it was), kept for
	// the journal. Never printed.
	OldValue []byte
	NewValue []byte
}

// Describe records how an object is stored, without deciding anything: Status is
// Readable, or Unreadable/NotObject when decodeErr is set.
func Describe(obj *decode.Object, decodeErr error) Decision {
	d := Decision{
		Key:         obj.KV.Key,
		Resource:    obj.Info.Resource,
		ModRevision: obj.KV.ModRevision,
		Lease:       obj.KV.Lease,
		Read:        obj.KV.Meta(),
		OldSize:     len(obj.KV.Value),
		OldValue:    obj.KV.Value,
		From: Form{
			Version:    obj.StoredGVK.GroupVersion().String(),
			MediaType:  decode.ShortMediaType(obj.MediaType),
			Encryption: obj.Encryption.String(),
		},
	}
	if decodeErr != nil {
		d.Err = keyError(d.Key, decode.ReasonCorruptPayload, decodeErr)
		switch d.Err.Reason {
		case decode.ReasonNotObject:
			d.Status = NotObject
		case decode.ReasonOrphaned:
			d.Status = Orphaned
		default:
			d.Status = Unreadable
		}
		return d
	}
	d.Status = Readable
	return d
}

// ReasonStrings joins reasons for a report.
func (d Decision) ReasonStrings() string {
	s := make([]string, len(d.Reasons))
	for i, r := range d.Reasons {
		s[i] = string(r)
	}
	return strings.Join(s, ",")
}

func keyError(key string, reason decode.Reason, err error) *decode.Error {
	var e *decode.Error
	if errors.As(err, &e) {
		if e.Key == "" {
			e.Key = key
		}
		return e
	}
	return &decode.Error{Key: key, Reason: reason, Err: err}
}

// ErrorReason gives the reason and a value-free detail of an unreadable (or
// not-an-object) decision; decode errors never carry plaintext.
func (d *Decision) ErrorReason() (decode.Reason, string) {
	if d.Err == nil {
		return decode.Reason("unknown"), fmt.Sprintf("status %s without an error", d.Status)
	}
	detail := d.Err.Detail
	if d.Err.Err != nil {
		if detail != "" {
			detail += ": "
		}
		detail += d.Err.Err.Error()
	}
	return d.Err.Reason, detail
}
