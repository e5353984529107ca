package restore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/reencode"
)

// readBackup reads the selected keys of the backup, decodes each with the
// backup's keys and re-encodes it for today's target, and adds the Namespace
// objects of the selected namespaces the live etcd lacks.
func (r *run) readBackup(ctx context.Context) error {
	cur, _, err := r.opts.Backup.Revisions(ctx)
	if err != nil {
		return fmt.Errorf("backup %s: %w", r.opts.BackupName, err)
	}
	r.res.BackupRevision = cur
	opts := etcdscan.ScanOptions{Prefixes: r.sel.prefixes, PageSize: r.env.Config.PageSize, Revision: cur, KeepRevision: true}
	_, err = r.opts.Backup.Scan(ctx, opts, func(page []etcdscan.KV) error {
		for _, kv := range page {
			if err := r.take(ctx, kv, false); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("backup %s: read %s: %w; nothing was written", r.opts.BackupName, strings.Join(r.sel.prefixes, ", "), err)
	}
	nsPrefix, err := r.env.Resolver.KeyPrefix(nsResource, "")
	if err != nil {
		return err
	}
	for _, ns := range sortedKeys(r.sel.namespaces) {
		key := nsPrefix + ns
		if r.has(key) {
			continue
		}
		live, err := r.env.Client.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("live etcd: read %s: %w; nothing was written", key, err)
		}
		if len(live.Kvs) > 0 {
			if r.terminating(ctx, live.Kvs[0].Key, live.Kvs[0].Value) {
				return &SelectError{Option: "namespace", Value: ns, Msg: "the live namespace is being deleted (Terminating): its namespace controller would delete what is restored into it; wait until it is gone, then restore it with its objects"}
			}
			continue
		}
		kv, found, err := r.opts.Backup.Get(ctx, key, cur)
		if err != nil {
			return fmt.Errorf("backup %s: read %s: %w; nothing was written", r.opts.BackupName, key, err)
		}
		if !found {
			return &SelectError{Option: "namespace", Value: ns, Msg: "neither the live etcd nor the backup holds this namespace"}
		}
		if err := r.take(ctx, kv, true); err != nil {
			return err
		}
	}
	return nil
}

// terminating says whether the live Namespace object at key is being deleted.
func (r *run) terminating(ctx context.Context, key, value []byte) bool {
	obj, err := r.env.Decoder.Decode(ctx, etcdscan.KV{Key: string(key), Value: value})
	if err != nil {
		return false
	}
	m, err := meta.Accessor(obj.Internal)
	return err == nil && m.GetDeletionTimestamp() != nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (r *run) has(key string) bool {
	return slices.ContainsFunc(r.cands, func(c *candidate) bool { return c.e.Key == key })
}

func (r *run) entry(e Entry) {
	switch e.Action {
	case ActionSkipped:
		r.res.Skipped++
	case ActionUnreadable:
		r.res.Unreadable++
	}
	r.res.Entries = append(r.res.Entries, e)
}

// take reads one key of the backup; namespace: the Namespace object of a
// selected namespace, taken whatever the other selectors say.
func (r *run) take(ctx context.Context, kv etcdscan.KV, namespace bool) error {
	info, err := r.env.Resolver.Resolve(kv.Key)
	if err != nil {
		var de *decode.Error
		if errors.As(err, &de) && de.Reason == decode.ReasonOrphaned {
			r.orphan(ctx, kv)
		}
		return nil // not an object (a lease record, the tool's own keys)
	}
	if !namespace && !r.sel.selects(kv.Key, info) {
		return nil
	}
	e := Entry{Key: kv.Key, Resource: info.Resource.String(), Namespace: info.Namespace, Name: info.Name}
	event := info.Resource == eventsResource
	switch {
	case event && !r.sel.events:
		e.Action, e.Note = ActionSkipped, "an Event (it expires): named by --resource events, it is restored with a fresh lease"
		r.entry(e)
		return nil
	case info.Resource == leasesResource && !r.sel.leases:
		e.Action, e.Note = ActionSkipped, "a Lease (a heartbeat its holder renews): restored only when its resource is named"
		r.entry(e)
		return nil
	case kv.Lease != 0 && !event:
		e.Action, e.Note = ActionSkipped, fmt.Sprintf("attached to etcd lease %016x in the backup: not restored", kv.Lease)
		r.entry(e)
		return nil
	}
	obj, derr := r.dec.Decode(ctx, kv)
	if obj != nil && obj.Encryption.Provider != "" {
		e.From = obj.Encryption.String()
		r.needs[e.From] = true
	}
	if derr != nil {
		var de *decode.Error
		if errors.As(derr, &de) && de.Reason == decode.ReasonUndecryptable && obj != nil {
			// The backup's configuration lacks its key, or has it and it
			// refused: either way a restore would be partial.
			m := r.refusedKeys
			if !r.opts.BackupEncryption.CanRead(info.Resource, obj.Encryption) {
				m = r.missingKeys
			}
			if _, ok := m[e.From]; !ok {
				m[e.From] = kv.Key
			}
			return nil
		}
		e.Action, e.Note = ActionUnreadable, reasonOf(derr)
		r.entry(e)
		return nil
	}
	value, plain, note, err := r.encode(ctx, kv, info.Resource, obj)
	if err != nil {
		return err
	}
	if note != "" {
		e.Action, e.Note = ActionUnreadable, note
		r.entry(e)
		return nil
	}
	e.To = r.env.Encryption.WriteProvider(info.Resource).String()
	// The value is not kept (memory stays flat whatever the selection):
	// written, it is encoded again (write.go), and must decrypt to the same.
	c := &candidate{e: &e, gr: info.Resource, plainSum: sha256.Sum256(plain), event: event, valueSize: len(value)}
	if r.opts.ToManifests != "" {
		c.obj, c.codec = obj.Internal, obj.Codec
	}
	if m, err := meta.Accessor(obj.Internal); err == nil {
		c.uid, c.owners = m.GetUID(), m.GetOwnerReferences()
	}
	r.cands = append(r.cands, c)
	return nil
}

// encode is the backup's value kv (decoded: obj) as today's kube-apiserver
// stores it: its bytes, and what they decrypt to. A value that cannot be
// stored so is a note (why; the object is unreadable), never an error; an
// error stops the restore.
func (r *run) encode(ctx context.Context, kv etcdscan.KV, gr schema.GroupResource, obj *decode.Object) (value, plain []byte, note string, err error) {
	// Decrypted with the backup's configuration, whose first key is not
	// today's: always written anew with today's write key.
	obj.Encryption.Stale = true
	d := r.env.Planner.Decide(ctx, obj, nil)
	switch d.Status {
	case reencode.Stale:
		p, _, err := r.env.Encryption.Decrypt(ctx, gr, kv.Key, d.NewValue)
		if err != nil {
			return nil, nil, "", fmt.Errorf("restore %s: today's encryption does not read back what it wrote: %w; nothing was written", kv.Key, err)
		}
		return d.NewValue, p, "", nil
	case reencode.Current:
		// Stored as today's kube-apiserver stores it, under a provider
		// and key of today's name: today's key must read it too.
		p, _, err := r.env.Encryption.Decrypt(ctx, gr, kv.Key, kv.Value)
		if err != nil || !bytes.Equal(p, obj.Plaintext) {
			return nil, nil, fmt.Sprintf("the backup's %s has the name of today's write key but other key material: today's configuration cannot read it", obj.Encryption.String()), nil
		}
		return kv.Value, obj.Plaintext, "", nil
	default:
		note := reasonOf(d.Err)
		if d.Err == nil {
			note = string(d.Status) + ": " + d.ReasonStrings()
		}
		return nil, nil, note, nil
	}
}

// reasonOf is a decode or re-encode error's reason and detail (never a value).
func reasonOf(err error) string {
	var de *decode.Error
	if errors.As(err, &de) {
		if de.Detail != "" {
			return string(de.Reason) + ": " + de.Detail
		}
		return string(de.Reason)
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// orphan notes a selected key of the backup no resource of the live
// cluster owns: a custom resource whose CRD is gone.
func (r *run) orphan(ctx context.Context, kv etcdscan.KV) {
	root := r.env.Resolver.Prefix() + "/"
	parts := strings.Split(strings.TrimPrefix(kv.Key, root), "/")
	if len(parts) < 3 || !strings.Contains(parts[0], ".") {
		return
	}
	info := decode.KeyInfo{Resource: schema.GroupResource{Group: parts[0], Resource: parts[1]}, Name: parts[len(parts)-1]}
	if len(parts) == 4 {
		info.Namespace = parts[2]
	}
	if r.sel.resources != nil || !r.sel.selects(kv.Key, info) {
		return
	}
	name := parts[1] + "." + parts[0]
	if _, seen := r.missingCRDs[name]; seen {
		return
	}
	crdKey := r.env.Resolver.CRDKeyPrefix() + name
	_, found, _ := r.opts.Backup.Get(ctx, crdKey, r.res.BackupRevision)
	r.missingCRDs[name] = found
}
