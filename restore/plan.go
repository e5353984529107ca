package restore

import (
	"context"
	"crypto/sha256"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/reencode"
)

// plan reads each candidate's key in the live etcd and decides its action,
// then checks the owners of those it writes.
func (r *run) plan(ctx context.Context) error {
	for _, c := range r.cands {
		resp, err := r.env.Client.Get(ctx, c.e.Key)
		if err != nil {
			return fmt.Errorf("live etcd: read %s: %w; nothing was written", c.e.Key, err)
		}
		if len(resp.Kvs) == 0 {
			c.e.Action = ActionCreate
			continue
		}
		kv := resp.Kvs[0]
		c.live = &etcdscan.KV{Key: c.e.Key, Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}
		obj, derr := r.env.Decoder.Decode(ctx, *c.live)
		if derr == nil {
			if m, err := meta.Accessor(obj.Internal); err == nil {
				c.liveUID = m.GetUID()
			}
			if d := r.env.Planner.Classify(ctx, obj, nil); d.Status == reencode.Current && sha256.Sum256(obj.Plaintext) == c.plainSum {
				c.e.Action = ActionSame
				continue
			}
		}
		if r.opts.Overwrite {
			c.e.Action = ActionOverwrite
			if derr != nil {
				c.e.Note = "the live value does not read (" + reasonOf(derr) + "): replaced"
			}
			continue
		}
		c.e.Action, c.e.Note = ActionExists, "the live etcd holds another value: left as it is (--overwrite replaces it)"
	}
	// The owners present once the restore is done: the selection's (what
	// it writes, or what is the same), then the live etcd's.
	present := map[types.UID]bool{}
	for _, c := range r.cands {
		switch c.e.Action {
		case ActionCreate, ActionOverwrite, ActionSame:
			present[c.uid] = true
		case ActionExists:
			present[c.liveUID] = true
		}
	}
	for _, c := range r.cands {
		if c.e.Action != ActionCreate && c.e.Action != ActionOverwrite {
			continue
		}
		for _, ref := range c.owners {
			if present[ref.UID] {
				continue
			}
			ok, err := r.liveOwner(ctx, c.e.Namespace, ref)
			if err != nil {
				return err
			}
			if ok {
				present[ref.UID] = true
				continue
			}
			c.e.Owners = append(c.e.Owners, fmt.Sprintf("%s/%s %s", ref.Kind, ref.Name, ref.UID))
		}
		if len(c.e.Owners) > 0 {
			r.res.Dangling++
			if r.opts.AllowDanglingOwners {
				c.e.Note = "its owner is absent (allowed): the garbage collector deletes it once it sees it"
			} else {
				c.e.Action, c.e.Note = ActionDanglingOwner, "its owner is neither in the live etcd nor in the selection: the garbage collector would delete it at once"
			}
		}
	}
	for _, c := range r.cands {
		switch c.e.Action {
		case ActionCreate:
			r.res.Create++
		case ActionOverwrite:
			r.res.Overwrite++
		case ActionSame:
			r.res.Same++
		case ActionExists:
			r.res.Exists++
		}
		r.res.Entries = append(r.res.Entries, *c.e)
	}
	return nil
}

// liveOwner says whether the live etcd holds the owner ref names, with its
// uid, in namespace (or cluster-scoped).
func (r *run) liveOwner(ctx context.Context, namespace string, ref metav1.OwnerReference) (bool, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return false, nil
	}
	gr := r.resourceOf(gv.WithKind(ref.Kind))
	for _, ns := range []string{namespace, ""} {
		p, err := r.env.Resolver.KeyPrefix(gr, ns)
		if err != nil {
			continue
		}
		key := p + ref.Name
		resp, err := r.env.Client.Get(ctx, key)
		if err != nil {
			return false, fmt.Errorf("live etcd: read %s (an owner): %w; nothing was written", key, err)
		}
		if len(resp.Kvs) == 0 {
			continue
		}
		kv := resp.Kvs[0]
		obj, err := r.env.Decoder.Decode(ctx, etcdscan.KV{Key: key, Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease})
		if err != nil {
			continue
		}
		if m, err := meta.Accessor(obj.Internal); err == nil && m.GetUID() == ref.UID {
			return true, nil
		}
	}
	return false, nil
}

// resourceOf is the resource of a kind: a live CRD's plural, else the
// built-in's (kube-apiserver's own plural of its kinds).
func (r *run) resourceOf(gvk schema.GroupVersionKind) schema.GroupResource {
	for _, crd := range r.env.CRDs {
		if crd.Object.Spec.Group == gvk.Group && crd.Object.Spec.Names.Kind == gvk.Kind {
			return crd.Resource
		}
	}
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	return plural.GroupResource()
}
