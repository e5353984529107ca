// Package restore puts chosen objects of an etcd backup back into a live etcd,
// as today's kube-apiserver would store them. It reads the backup in place (an
// etcdscan.Source: package snapshotdb), decrypts each selected value with the
// backup's own encryption configuration, decodes it with kube-apiserver's
// decoder and re-encodes it through the same planner migrate writes with
// (reencode: today's storage version, media type and first encryption key;
// custom resources by today's CRDs, read from the live etcd), so that uid,
// ownerReferences, finalizers, labels, annotations, spec and status stay as
// they were and resourceVersion becomes etcd's new revision. It creates only
// (compare-and-swap on the key being absent) unless asked to overwrite (on the
// key's current mod revision); every write is journaled for rollback first
// (a creation as "create-intent", which a rollback deletes; an overwrite as
// "intent" with the old value). Keys attached to an etcd lease are not
// restored, except Events when they are asked for, which get a fresh lease
// as kube-apiserver gives them. What the backup needs (its keys, a CRD absent
// today, an owner absent from both the live etcd and the selection) is found
// and refused before anything is written. Asked for manifests instead
// (Options.ToManifests), it writes the selection as files for kubectl create
// and leaves etcd alone.
package restore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/storage/etcd3"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// What the plan says of each key of the selection.
const (
	ActionCreate    = "create"
	ActionOverwrite = "overwrite"
	ActionSame      = "same"
	ActionExists    = "exists"
	ActionSkipped   = "skipped"
	// ActionUnreadable: the backup's value does not decrypt, decode or
	// re-encode (its reason in the note); it is not written.
	ActionUnreadable = "unreadable"
	// ActionDanglingOwner: an ownerReference names an owner neither in the
	// live etcd nor in the selection (the garbage collector would delete the
	// object at once): refused unless AllowDanglingOwners.
	ActionDanglingOwner = "dangling-owner"
	// ActionManifest: written to a manifest file (ToManifests).
	ActionManifest = "manifest"
)

// What became of a write.
const (
	ResultWritten  = "written"
	ResultConflict = "conflict"
	ResultFailed   = "failed"
)

// Selector is which keys of the backup are restored: each field given
// narrows the selection (they compose); at least one must be given.
type Selector struct {
	Namespaces []string
	Resources  []string // as --resource: secrets, deployments.apps, widgets.example.com
	Names      []string
	// Keys are raw key prefixes, under the etcd prefix.
	Keys []string
}

func (s Selector) empty() bool {
	return len(s.Namespaces) == 0 && len(s.Resources) == 0 && len(s.Names) == 0 && len(s.Keys) == 0
}

// Options control a restore.
type Options struct {
	// Backup is the backup read in place; BackupName names it in messages.
	Backup     etcdscan.Source
	BackupName string
	// BackupEncryption decrypts the backup's values (the keys they were
	// written under); BackupEncryptionName names its configuration.
	BackupEncryption     *encryption.Transformers
	BackupEncryptionName string
	Select               Selector
	// Overwrite replaces an object that exists (else it is left, "exists").
	Overwrite bool
	// AllowDanglingOwners restores objects whose owner is absent anyway.
	AllowDanglingOwners bool
	DryRun              bool
	// ToManifests, when set, is a directory the selection is written to as
	// manifests (one YAML file per object, mode 0600, server-set fields
	// removed) instead of into etcd: nothing is written to etcd.
	ToManifests string
	// EventTTL is the lease restored Events get; 0: the target
	// kube-apiserver's --event-ttl (its manifest's, else its default).
	EventTTL time.Duration

	// Journal is where the writes are journaled (required unless DryRun);
	// Snapshot, when set, is where etcd is saved before the first write.
	Journal, Snapshot string
	// Lock is the writing run's lock (guard.FirstWrite.Lock).
	Lock func(context.Context) error
	// OnPreflight is given the checks passed before the first write.
	OnPreflight func(checks []string) error
	// Watch is the writing run's liveness watch (nil: none).
	Watch *guard.Watch
	// StateDir is where a rollback of the run keeps its own undo.
	StateDir undo.StateDir
	// BatchOps is the number of writes per transaction.
	BatchOps int
	// WriteContext is used for the writes and the journal: it should
	// outlive a SIGINT. nil: the run's context.
	WriteContext context.Context
}

// Entry is one key of the selection.
type Entry struct {
	Key       string `json:"key"`
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Action is what the plan does with it (Action* constants).
	Action string `json:"action"`
	// Note says why (never a value).
	Note string `json:"note,omitempty"`
	// Owners are the owners a dangling-owner entry names (Kind/name uid).
	Owners []string `json:"danglingOwners,omitempty"`
	// Result is what became of its write (a run that writes).
	Result         string `json:"result,omitempty"`
	NewModRevision int64  `json:"newModRevision,omitempty"`
	// From and To are the backup's encryption and today's.
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
}

// Result is what a restore found and did.
type Result struct {
	DryRun         bool     `json:"dryRun"`
	Backup         string   `json:"backup"`
	BackupRevision int64    `json:"backupRevision"`
	Prefixes       []string `json:"prefixes"`
	// Needs are the backup's providers and keys the selection was written
	// under (provider[:key]).
	Needs     []string `json:"needs"`
	Journal   string   `json:"journal,omitempty"`
	Preflight []string `json:"preflight,omitempty"`

	Create     int64 `json:"create"`
	Overwrite  int64 `json:"overwrite"`
	Same       int64 `json:"same"`
	Exists     int64 `json:"exists"`
	Skipped    int64 `json:"skipped"`
	Unreadable int64 `json:"unreadable"`
	Dangling   int64 `json:"danglingOwner"`
	// Manifests counts the files written (ToManifests), Secrets those of
	// Secrets among them.
	Manifests int64 `json:"manifests,omitempty"`
	Secrets   int64 `json:"secrets,omitempty"`
	Written   int64 `json:"written"`
	Conflicts int64 `json:"conflicts"`
	Failed    int64 `json:"failed"`

	Entries     []Entry `json:"entries"`
	Interrupted bool    `json:"interrupted,omitempty"`
	Duration    string  `json:"duration"`
}

// SelectError is a selection the live cluster or the backup cannot serve:
// Option names the selector ("namespace", "resource", "name", "key").
// Nothing was written.
type SelectError struct {
	Option, Value, Msg string
}

func (e *SelectError) Error() string {
	return fmt.Sprintf("restore %s %s: %s", e.Option, e.Value, e.Msg)
}

// MissingKeysError is values of the backup under providers or keys the
// backup's encryption configuration does not have (Keys), or has but that
// refused them (Refused: other key material under the same name, a KMS
// plugin down). Nothing was written.
type MissingKeysError struct {
	Config string
	// Keys and Refused are provider[:key] → the first key of etcd under it.
	Keys, Refused map[string]string
}

func (e *MissingKeysError) Error() string {
	cfg := e.Config
	if cfg == "" {
		cfg = "the backup's encryption configuration"
	}
	var parts []string
	if len(e.Keys) > 0 {
		parts = append(parts, fmt.Sprintf("the backup's values need %s, which %s does not hold: give the encryption configuration the backup was written with", listKeys(e.Keys), cfg))
	}
	if len(e.Refused) > 0 {
		parts = append(parts, fmt.Sprintf("the backup's values under %s do not decrypt with %s (other key material under that name, or its KMS plugin refused): give the configuration the backup was written with, its plugins running", listKeys(e.Refused), cfg))
	}
	return strings.Join(parts, "; ") + "; nothing was written"
}

// listKeys is "provider:key (e.g. KEY), ..." in name order.
func listKeys(m map[string]string) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s (e.g. %s)", n, m[n])
	}
	return strings.Join(parts, ", ")
}

// MissingCRDError is custom resources of the backup whose CRD the live etcd
// lacks: today's CRD decides how they are stored. Nothing was written.
type MissingCRDError struct {
	// CRDs are the CRDs' names (plural.group) → whether the backup holds it.
	CRDs map[string]bool
}

func (e *MissingCRDError) Error() string {
	names := make([]string, 0, len(e.CRDs))
	for k := range e.CRDs {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	for _, n := range names {
		how := "create it first (kubectl apply of its definition)"
		if e.CRDs[n] {
			how = "restore it first (restore --resource customresourcedefinitions.apiextensions.k8s.io --name " + n + "), then run this restore again"
		}
		parts = append(parts, fmt.Sprintf("CRD %s is not in the live etcd: %s", n, how))
	}
	return strings.Join(parts, "; ") + "; nothing was written"
}

// DanglingOwnersError refuses a restore whose objects name owners absent
// from both the live etcd and the selection. Nothing was written.
type DanglingOwnersError struct{ N int64 }

func (e *DanglingOwnersError) Error() string {
	return fmt.Sprintf("%d object(s) name an owner that is neither in the live etcd nor in the selection (listed as dangling-owner): the garbage collector would delete them at once; add their owners to the selection, or allow them; nothing was written", e.N)
}

// candidate is one selected key of the backup that reads, with what
// today's kube-apiserver would store.
type candidate struct {
	e     *Entry
	gr    schema.GroupResource
	value []byte // to write (encrypted as today's)
	// plainSum is the sha256 of what value decrypts to: "same" compares the
	// live object's with it (no plaintext kept).
	plainSum [sha256.Size]byte
	uid      types.UID
	owners   []metav1.OwnerReference
	event    bool
	// obj and codec are the decoded object and its codec (ToManifests).
	obj   runtime.Object
	codec *decode.ResourceCodec
	// live is the key as it is now (overwrite, same, exists).
	live    *etcdscan.KV
	liveUID types.UID
}

// run is one restore.
type run struct {
	env   *pipeline.Env
	opts  Options
	res   *Result
	dec   *decode.Decoder
	sel   selection
	cands []*candidate
	// missing keys and CRDs found while reading the backup.
	missingKeys, refusedKeys map[string]string
	missingCRDs              map[string]bool
	needs                    map[string]bool
}

// Run restores what opts select from the backup into env's etcd (env is
// set up on the live etcd, with today's target and encryption). The result is
// complete even when err is set.
func Run(ctx context.Context, env *pipeline.Env, opts Options) (*Result, error) {
	start := time.Now()
	res := &Result{DryRun: opts.DryRun, Backup: opts.BackupName, Journal: opts.Journal, Entries: []Entry{}, Needs: []string{}}
	defer func() {
		sort.SliceStable(res.Entries, func(i, j int) bool { return res.Entries[i].Key < res.Entries[j].Key })
		res.Duration = time.Since(start).Round(time.Millisecond).String()
	}()
	switch {
	case opts.Backup == nil:
		return res, errors.New("restore: no backup to read")
	case opts.Select.empty():
		return res, &SelectError{Option: "namespace", Msg: "select what to restore (a namespace, a resource, a name or a key prefix): a restore never takes the whole backup"}
	case !opts.DryRun && opts.ToManifests == "" && opts.Journal == "":
		return res, errors.New("restore: a journal is required (for rollback), unless a dry run")
	}
	r := &run{env: env, opts: opts, res: res, missingKeys: map[string]string{}, refusedKeys: map[string]string{}, missingCRDs: map[string]bool{}, needs: map[string]bool{}}
	sel, err := r.selection()
	if err != nil {
		return res, err
	}
	r.sel = sel
	res.Prefixes = sel.prefixes
	r.dec = decode.NewDecoder(env.Resolver, env.Storage, opts.BackupEncryption)
	r.dec.KeepVersioned = env.Planner.Converts
	for _, crd := range env.CRDs {
		if crd.Codec != nil {
			r.dec.AddCustomResource(crd.Resource, crd.Codec)
		}
	}
	if err := r.readBackup(ctx); err != nil {
		return res, err
	}
	for k := range r.needs {
		res.Needs = append(res.Needs, k)
	}
	sort.Strings(res.Needs)
	if len(r.missingKeys) > 0 || len(r.refusedKeys) > 0 {
		return res, &MissingKeysError{Config: opts.BackupEncryptionName, Keys: r.missingKeys, Refused: r.refusedKeys}
	}
	if len(r.missingCRDs) > 0 {
		return res, &MissingCRDError{CRDs: r.missingCRDs}
	}
	if opts.ToManifests != "" {
		return res, r.manifests()
	}
	if err := r.plan(ctx); err != nil {
		return res, err
	}
	if res.Dangling > 0 && !opts.AllowDanglingOwners {
		return res, &DanglingOwnersError{N: res.Dangling}
	}
	if opts.DryRun {
		return res, nil
	}
	return res, r.write(ctx)
}

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
	// Decrypted with the backup's configuration, whose first key is not
	// today's: always written anew with today's write key.
	obj.Encryption.Stale = true
	d := r.env.Planner.Decide(ctx, obj, nil)
	var value, plain []byte
	switch d.Status {
	case reencode.Stale:
		value = d.NewValue
		p, _, err := r.env.Encryption.Decrypt(ctx, info.Resource, kv.Key, value)
		if err != nil {
			return fmt.Errorf("restore %s: today's encryption does not read back what it wrote: %w; nothing was written", kv.Key, err)
		}
		plain = p
	case reencode.Current:
		// Stored as today's kube-apiserver stores it, under a provider
		// and key of today's name: today's key must read it too.
		p, _, err := r.env.Encryption.Decrypt(ctx, info.Resource, kv.Key, kv.Value)
		if err != nil || !bytes.Equal(p, obj.Plaintext) {
			e.Action, e.Note = ActionUnreadable, fmt.Sprintf("the backup's %s has the name of today's write key but other key material: today's configuration cannot read it", e.From)
			r.entry(e)
			return nil
		}
		value, plain = kv.Value, obj.Plaintext
	default:
		e.Action, e.Note = ActionUnreadable, reasonOf(d.Err)
		if d.Err == nil {
			e.Note = string(d.Status) + ": " + d.ReasonStrings()
		}
		r.entry(e)
		return nil
	}
	e.To = r.env.Encryption.WriteProvider(info.Resource).String()
	c := &candidate{e: &e, gr: info.Resource, value: value, plainSum: sha256.Sum256(plain), event: event}
	if r.opts.ToManifests != "" {
		c.obj, c.codec = obj.Internal, obj.Codec
	}
	if m, err := meta.Accessor(obj.Internal); err == nil {
		c.uid, c.owners = m.GetUID(), m.GetOwnerReferences()
	}
	r.cands = append(r.cands, c)
	return nil
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

// write journals and writes the creations and overwrites, a batch at a time.
func (r *run) write(ctx context.Context) error {
	var todo []*candidate
	for _, c := range r.cands {
		if c.e.Action == ActionCreate || c.e.Action == ActionOverwrite {
			todo = append(todo, c)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	writeCtx := r.opts.WriteContext
	if writeCtx == nil {
		writeCtx = ctx
	}
	r.res.Preflight = append(r.res.Preflight, fmt.Sprintf("the backup's values read with %s: %s", orWords(r.opts.BackupEncryptionName, "the backup's encryption configuration"), strings.Join(r.res.Needs, ", ")))
	checks, err := guard.PreflightOffline(ctx, r.env, guard.PreflightOptions{})
	r.res.Preflight = append(r.res.Preflight, checks...)
	if err != nil {
		return err
	}
	journal, err := r.beforeFirstWrite(ctx, todo)
	if err != nil {
		return err
	}
	defer journal.Close()
	var lease int64
	if slices.ContainsFunc(todo, func(c *candidate) bool { return c.event }) {
		if lease, err = r.eventLease(writeCtx); err != nil {
			return err
		}
	}
	watch := r.opts.Watch
	w := &etcdscan.Writer{Client: r.env.Client, MaxOps: r.opts.BatchOps, Observer: watch.Observer()}
	batch := r.opts.BatchOps
	if batch <= 0 {
		batch = etcdscan.DefaultMaxOps
	}
	for len(todo) > 0 && err == nil {
		if ctx.Err() != nil {
			r.res.Interrupted = true
			err = errors.New("interrupted: the batches in flight finished and are journaled; run again to go on, or roll the run back")
			break
		}
		if err = watch.Stopped(); err != nil {
			break
		}
		n := min(batch, len(todo))
		err = r.writeBatch(writeCtx, w, journal, todo[:n], lease)
		todo = todo[n:]
	}
	var we *liveness.WriterError
	if serr := watch.Settle(writeCtx); serr != nil && (err == nil || errors.As(serr, &we)) {
		err = serr
	}
	r.syncEntries()
	return err
}

// eventLease grants the lease restored Events are attached to, as
// kube-apiserver's storage does for an Event it creates (etcd3's lease
// manager: the TTL plus its reuse period, 5 % of the TTL at most its
// default ReuseDurationSeconds).
func (r *run) eventLease(ctx context.Context) (int64, error) {
	eventTTL := r.opts.EventTTL
	if eventTTL <= 0 {
		eventTTL = r.env.Target.APIServer().EventTTL()
	}
	ttl := int64(eventTTL / time.Second)
	reuse := min(int64(float64(ttl)*0.05), leaseReuseSeconds())
	resp, err := r.env.Client.Grant(ctx, ttl+reuse)
	if err != nil {
		return 0, fmt.Errorf("grant the Events' lease (%d s): %w; no Event was written", ttl+reuse, err)
	}
	return int64(resp.ID), nil
}

// beforeFirstWrite checks the room for the undo, then takes the run's lock,
// saves the snapshot while the liveness window ends, records the plan and
// opens the journal (guard.FirstWrite).
func (r *run) beforeFirstWrite(ctx context.Context, todo []*candidate) (*undo.Journal, error) {
	st, err := etcdscan.Status(ctx, r.env.Client)
	if err != nil {
		return nil, err
	}
	space := guard.RunSpace{Snapshot: r.opts.Snapshot, Journal: r.opts.Journal, StateDir: r.opts.StateDir, Status: st, Quota: 1 << 62}
	for _, c := range todo {
		old := 0
		if c.live != nil {
			old = len(c.live.Value)
		}
		space.JournalBytes += undo.JournalRecordBytes(c.e.Key, old)
		space.Writes += guard.PutCostSize(len(c.e.Key), len(c.value))
		space.RollbackWrites += guard.PutCostSize(len(c.e.Key), old)
		space.RollbackJournalBytes += undo.JournalRecordBytes(c.e.Key, len(c.value))
	}
	space.Etcd = guard.FindEtcdData(r.env.Target.APIServer().Manifest, guard.EtcdDataOf(r.env.Target.APIServer()))
	lines, err := guard.CheckDiskSpace(space.Needs())
	r.res.Preflight = append(r.res.Preflight, lines...)
	if err != nil {
		var se *guard.DiskSpaceError
		if errors.As(err, &se) {
			return nil, &guard.PreflightError{Err: se}
		}
		return nil, err
	}
	rev := st.Revision
	var journal *undo.Journal
	first := &guard.FirstWrite{Watch: r.opts.Watch, Client: r.env.Client, Snapshot: r.opts.Snapshot, Lock: r.opts.Lock, Then: func(line string) error {
		if line != "" {
			r.res.Preflight = append(r.res.Preflight, line)
		}
		if r.opts.OnPreflight != nil {
			if err := r.opts.OnPreflight(r.res.Preflight); err != nil {
				return err
			}
		}
		j, err := undo.OpenJournal(r.opts.Journal)
		if err != nil {
			return err
		}
		if err := j.BeginCommand("restore", rev, r.env.Resolver.Prefix()); err != nil {
			j.Close()
			return err
		}
		journal = j
		return nil
	}}
	if err := first.Open(ctx); err != nil {
		return nil, err
	}
	return journal, nil
}

// writeBatch journals a batch (a creation as "create-intent", an overwrite
// as "intent" with the old value), writes it with compare-and-swap (a
// creation on the key being absent) and journals what landed.
func (r *run) writeBatch(ctx context.Context, w *etcdscan.Writer, j *undo.Journal, cs []*candidate, lease int64) error {
	recs := make([]undo.JournalRecord, len(cs))
	puts := make([]etcdscan.Put, len(cs))
	for i, c := range cs {
		sum := sha256.Sum256(c.value)
		newSum := hex.EncodeToString(sum[:])
		if c.live == nil {
			p := etcdscan.Put{Key: c.e.Key, Value: c.value}
			if c.event {
				p.Lease = lease
			}
			puts[i] = p
			recs[i] = undo.JournalRecord{Op: "create-intent", Key: c.e.Key, NewSHA256: newSum, Lease: p.Lease}
			continue
		}
		puts[i] = etcdscan.Put{Key: c.e.Key, Value: c.value, ModRevision: c.live.ModRevision}
		recs[i] = undo.JournalRecord{Op: "intent", Key: c.e.Key, OldModRevision: c.live.ModRevision, OldValue: c.live.Value, NewSHA256: newSum}
	}
	if err := j.Append(true, recs...); err != nil {
		return fmt.Errorf("restore: %w (nothing of this batch was written)", err)
	}
	results := w.Write(ctx, puts)
	if err := j.Done(results); err != nil {
		return err
	}
	for i, res := range results {
		c := cs[i]
		switch res.Status {
		case etcdscan.Written:
			c.e.Result, c.e.NewModRevision = ResultWritten, res.NewModRevision
			r.res.Written++
		case etcdscan.Conflict:
			c.e.Result, c.e.Note = ResultConflict, "changed since it was read: left as it is (run again to see it)"
			r.res.Conflicts++
		default:
			c.e.Result, c.e.Note = ResultFailed, guard.WriteCause(res.Err)
			r.res.Failed++
		}
	}
	if key, fe := guard.FirstFatal(results); fe != nil {
		return fmt.Errorf("restore: write %s: %w", key, fe)
	}
	return nil
}

// syncEntries copies the candidates' outcomes into the result's entries.
func (r *run) syncEntries() {
	byKey := map[string]*Entry{}
	for _, c := range r.cands {
		byKey[c.e.Key] = c.e
	}
	for i := range r.res.Entries {
		if e, ok := byKey[r.res.Entries[i].Key]; ok {
			r.res.Entries[i] = *e
		}
	}
}

// leaseReuseSeconds is etcd3's lease manager's default reuse period.
func leaseReuseSeconds() int64 {
	return etcd3.NewDefaultLeaseManagerConfig().ReuseDurationSeconds
}

func orWords(s, words string) string {
	if s == "" {
		return words
	}
	return s
}
