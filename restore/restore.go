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
	"context"
	"crypto/sha256"
	"errors"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/pipeline"
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
	// SaveSnapshot, when set, saves Snapshot instead of etcd's own
	// snapshot (guard.FirstWrite's Save: a SQLite datastore's copy).
	SaveSnapshot func(ctx context.Context, path string) (undo.FileSum, error)
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

// candidate is one selected key of the backup that reads, with what
// today's kube-apiserver would store.
type candidate struct {
	e  *Entry
	gr schema.GroupResource
	// plainSum is the sha256 of what its value as today's kube-apiserver
	// stores it decrypts to: "same" compares the live object's with it,
	// and the value encoded again to be written must give it back (no
	// value or plaintext is kept); valueSize is that value's size.
	plainSum  [sha256.Size]byte
	valueSize int
	uid       types.UID
	owners    []metav1.OwnerReference
	event     bool
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
	// space keeps etcd below its quota as the batches go (set before the
	// first write).
	space *guard.SpaceGuard
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
