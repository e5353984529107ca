package migrate

import (
	"context"
	"fmt"
	"slices"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// CRDResult says what happened to one CRD's status.storedVersions.
type CRDResult struct {
	Name           string   `json:"name"`
	StorageVersion string   `json:"storageVersion"`
	StoredVersions []string `json:"storedVersions"`
	// Action: "current" (already only the storage version), "trimmed",
	// "would-trim" (dry run), "kept" (objects remain in other versions), "failed".
	Action string `json:"action"`
	Detail string `json:"detail,omitempty"`
}

func inScope(env *pipeline.Env, crd *pipeline.CRD) bool {
	return env.Filter == nil || env.Filter[crd.Resource] || env.Filter[decode.CRDGroupResource]
}

// PlanStoredVersions reports, without writing, which CRDs could be trimmed.
func PlanStoredVersions(env *pipeline.Env, pending map[schema.GroupResource]int64) []CRDResult {
	var out []CRDResult
	for _, crd := range env.CRDs {
		if !inScope(env, crd) {
			continue
		}
		r := CRDResult{Name: crd.Object.Name, StorageVersion: crd.StorageVersion, StoredVersions: crd.StoredVersions}
		switch {
		case slices.Equal(crd.StoredVersions, []string{crd.StorageVersion}):
			r.Action = "current"
		case pending[crd.Resource] > 0:
			r.Action = "would-trim"
			r.Detail = fmt.Sprintf("after %d object(s) are rewritten", pending[crd.Resource])
		default:
			r.Action = "would-trim"
		}
		out = append(out, r)
	}
	return out
}

// TrimStoredVersions sets status.storedVersions to [storage version] on every CRD
// in scope whose objects are now all stored in that version, checked by a fresh scan
// of its custom resources, with a CAS write on the CRD key. This is what makes
// removing an old version from the CRD safe.
//
// decidedAt is the revision as of which the run read and decided every
// object of every custom resource in scope (its scan's first revision, no
// namespace filter; a scan that restarted at a newer revision after a
// compaction read every key once, and a key last written at or before
// decidedAt held the same bytes there), 0 when it did not. pending counts, per custom resource, the
// objects of that scan that are not now in the storage version (not
// current, not rewritten). A key whose mod revision is at most decidedAt
// holds the bytes that scan decided, and decoding them again gives the same
// answer; with nothing pending that answer was "current", so the re-check
// decodes only the keys written since by any other writer. A key whose mod
// revision is one of own's (the revisions of the run's own writes of custom
// resources) holds the value the run wrote there, encoded in the storage
// version: etcd gives each transaction its own revision, and a key's mod
// revision is that of the transaction that last wrote it.
//
// beforeWrite is called before each write: the run's first write waits
// there (the liveness window's verdict, the snapshot), and it gives the
// journal (nil: none); its error ends the trim and is returned.
func TrimStoredVersions(ctx context.Context, env *pipeline.Env, pending map[schema.GroupResource]int64, decidedAt int64, own *Revisions, w guard.Store, beforeWrite func(context.Context) (*undo.Journal, error)) ([]CRDResult, error) {
	var out []CRDResult
	for _, crd := range env.CRDs {
		if !inScope(env, crd) {
			continue
		}
		r := CRDResult{Name: crd.Object.Name, StorageVersion: crd.StorageVersion, StoredVersions: crd.StoredVersions}
		if slices.Equal(crd.StoredVersions, []string{crd.StorageVersion}) {
			r.Action = "current"
			out = append(out, r)
			continue
		}
		if n := pending[crd.Resource]; n > 0 {
			r.Action, r.Detail = "kept", fmt.Sprintf("%d object(s) not rewritten to %s", n, crd.StorageVersion)
			out = append(out, r)
			continue
		}
		since := decidedAt
		if env.Filter != nil && !env.Filter[crd.Resource] {
			since = 0 // its objects were not read by the run
		}
		others, err := notInStorageVersionSince(ctx, env, crd, since, own)
		if err != nil {
			return out, err
		}
		if others > 0 {
			r.Action, r.Detail = "kept", fmt.Sprintf("%d object(s) found in other versions or unreadable on re-check", others)
			out = append(out, r)
			continue
		}
		j, err := beforeWrite(ctx)
		if err != nil {
			return out, err
		}
		if err := trimOne(ctx, env, crd, w, j); err != nil {
			r.Action, r.Detail = "failed", err.Error()
			out = append(out, r)
			continue
		}
		r.Action = "trimmed"
		r.StoredVersions = []string{crd.StorageVersion}
		out = append(out, r)
	}
	return out, nil
}

// NotInStorageVersion counts, by a fresh scan of its custom resources at the
// current revision, the objects of crd not stored in its storage version or
// not readable: status.storedVersions may be trimmed only when there are none.
func NotInStorageVersion(ctx context.Context, env *pipeline.Env, crd *pipeline.CRD) (int64, error) {
	return notInStorageVersionSince(ctx, env, crd, 0, nil)
}

// notInStorageVersionSince is NotInStorageVersion that does not decode the
// keys last written at or before the revision since, nor those last written
// by the run itself at a revision in own (known to be in the storage
// version, see TrimStoredVersions).
func notInStorageVersionSince(ctx context.Context, env *pipeline.Env, crd *pipeline.CRD, since int64, own *Revisions) (int64, error) {
	prefix, err := env.Resolver.KeyPrefix(crd.Resource, "")
	if err != nil {
		return 0, err
	}
	want := schema.GroupVersion{Group: crd.Resource.Group, Version: crd.StorageVersion}.String()
	var n int64
	_, err = env.Source.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{prefix}, PageSize: env.Config.PageSize}, func(page []etcdscan.KV) error {
		for _, kv := range page {
			if kv.ModRevision <= since || own.Has(kv.ModRevision) {
				continue
			}
			d := env.DecideOne(ctx, kv, pipeline.DecodeOnly)
			if d.Status != reencode.Readable || d.From.Version != want {
				n++
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("re-check %s objects: %w", crd.Resource, err)
	}
	return n, nil
}

// trimOne rewrites the CRD object with status.storedVersions = [storage version],
// encoded as the apiextensions-apiserver stores CRDs.
func trimOne(ctx context.Context, env *pipeline.Env, crd *pipeline.CRD, w guard.Store, j *undo.Journal) error {
	kv, found, err := w.Get(ctx, crd.Key)
	if err != nil {
		return fmt.Errorf("%s: %w", crd.Key, err)
	}
	if !found {
		return fmt.Errorf("%s: CRD was deleted", crd.Key)
	}
	obj, err := env.Decoder.Decode(ctx, kv)
	if err != nil {
		return err
	}
	internal, ok := obj.Internal.(*apiextensions.CustomResourceDefinition)
	if !ok {
		return fmt.Errorf("%s: not a CRD", crd.Key)
	}
	internal.Status.StoredVersions = []string{crd.StorageVersion}
	rc, err := env.Target.Storage().Codec(decode.CRDGroupResource)
	if err != nil {
		return err
	}
	plain, err := runtime.Encode(rc.Codec, internal)
	if err != nil {
		return fmt.Errorf("%s: encode: %w", crd.Key, err)
	}
	value, err := env.Encryption.Encrypt(ctx, decode.CRDGroupResource, crd.Key, plain)
	if err != nil {
		return fmt.Errorf("%s: encrypt: %w", crd.Key, err)
	}
	put := etcdscan.Put{Key: crd.Key, Value: value, ModRevision: kv.ModRevision, Read: kv.Meta()}
	if j != nil {
		if err := j.Intents([]etcdscan.Put{put}, [][]byte{kv.Value}); err != nil {
			return err
		}
	}
	res := w.Write(ctx, []etcdscan.Put{put})
	if j != nil {
		if err := j.Done(res); err != nil {
			return err
		}
	}
	switch res[0].Status {
	case etcdscan.Written:
		return nil
	case etcdscan.Conflict:
		return fmt.Errorf("%s: CRD changed during the trim; run again", crd.Key)
	}
	return fmt.Errorf("%s: %v", crd.Key, res[0].Err)
}

// Revisions is a set of etcd revisions, at most maxRevisions of them: past
// that it forgets them all and holds none from then on (Has is false), so
// its memory stays bounded whatever the run writes. The zero value is empty;
// a nil *Revisions holds none.
type Revisions struct {
	set  map[int64]struct{}
	full bool
}

// maxRevisions bounds a Revisions (about 40 MB of map at the most; a run's
// writes take one revision per transaction of up to 128 puts).
const maxRevisions = 1 << 20

// Add records rev.
func (r *Revisions) Add(rev int64) {
	if r.full {
		return
	}
	if len(r.set) >= maxRevisions {
		r.set, r.full = nil, true
		return
	}
	if r.set == nil {
		r.set = map[int64]struct{}{}
	}
	r.set[rev] = struct{}{}
}

// Has reports whether rev was recorded (false once the set is full).
func (r *Revisions) Has(rev int64) bool {
	if r == nil || r.full {
		return false
	}
	_, ok := r.set[rev]
	return ok
}
