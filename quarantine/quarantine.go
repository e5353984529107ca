// Package quarantine removes from etcd the objects kube-apiserver cannot serve —
// under an encryption key the configuration no longer has, or whose envelope or
// payload does not decode — so that LISTs of their resource work again after a
// key loss. It removes only objects of the resources and for the reasons the
// operator names, each with compare-and-swap on its mod revision, after writing
// its key, raw value, lease and revisions to a journal (mode 0600) from which
// rollback.Rollback creates it again. It never removes an object that decrypts
// and decodes, nor one a configured key or KMS plugin refused (a wrong key file
// or a plugin outage is not a lost key), nor, under a key that refused others,
// one that decrypted to something undecodable (aescbc does not authenticate:
// wrong key material sometimes "decrypts" to garbage).
//
// It also removes orphaned keys (decode.ReasonOrphaned: no built-in resource or
// CRD of the cluster owns them, kube-apiserver never reads them), in a run of
// their own over the whole prefix, journaled the same way.
package quarantine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// Removable are the reasons a quarantine may be asked to remove objects for:
// kube-apiserver cannot read such a value with this configuration either, or
// (orphaned) never reads the key at all.
var Removable = []decode.Reason{
	decode.ReasonUndecryptable,
	decode.ReasonCorruptEnvelope,
	decode.ReasonCorruptPayload,
	decode.ReasonUnknownKind,
	decode.ReasonOrphaned,
}

// OnlyOrphaned reports whether reasons is just orphaned: such a run needs no
// --resource (orphaned keys belong to none) and accepts none.
func OnlyOrphaned(reasons []decode.Reason) bool {
	return len(reasons) == 1 && reasons[0] == decode.ReasonOrphaned
}

// Option names what an *OptionError is about: one of Options' settings or the
// run's resource filter. The command layer names the flag that sets it.
type Option string

// The options an OptionError names.
const (
	OptionReasons   Option = "reasons"
	OptionResources Option = "resources"
	OptionRevision  Option = "revision"
	OptionJournal   Option = "journal"
)

// OptionError is a quarantine the options do not allow: nothing was read or
// written.
type OptionError struct {
	Option Option
	Value  string // the value at fault ("" when the option is missing)
	Msg    string
	// See, when set, is the option value that does what was asked for.
	See      Option
	SeeValue string
}

func (e *OptionError) Error() string {
	what := "quarantine " + string(e.Option)
	if e.Value != "" {
		what += " " + e.Value
	}
	return what + ": " + e.Msg + e.Seen(string(e.See))
}

// Seen is " (NAME VALUE)" naming See by name, "" without See.
func (e *OptionError) Seen(name string) string {
	if e.See == "" {
		return ""
	}
	return " (" + name + " " + e.SeeValue + ")"
}

// ParseReasons reads reason names (repeatable, comma separated), refusing a
// reason quarantine never removes objects for (*OptionError).
func ParseReasons(vals []string) ([]decode.Reason, error) {
	var out []decode.Reason
	for _, v := range vals {
		for _, r := range strings.Split(v, ",") {
			r = strings.TrimSpace(r)
			if r == "" {
				continue
			}
			reason := decode.Reason(r)
			switch {
			case slices.Contains(Removable, reason):
				if !slices.Contains(out, reason) {
					out = append(out, reason)
				}
			case reason == decode.ReasonWouldLoseFields || reason == decode.ReasonConversionFailed:
				return nil, &OptionError{Option: OptionReasons, Value: r, Msg: "such objects decode (kube-apiserver serves them); quarantine never removes a readable object"}
			case reason == decode.ReasonUnknownResource:
				return nil, &OptionError{Option: OptionReasons, Value: r, Msg: "such keys are under a resource kube-apiserver reads (its CRD is in etcd but unusable, or the key holds a kind it serves); quarantine does not remove them. Keys no built-in resource or CRD owns are orphaned", See: OptionReasons, SeeValue: string(decode.ReasonOrphaned)}
			default:
				return nil, &OptionError{Option: OptionReasons, Value: r, Msg: fmt.Sprintf("not a reason quarantine removes objects for (want %s)", textfmt.Join(Removable, ", "))}
			}
		}
	}
	if len(out) == 0 {
		return nil, &OptionError{Option: OptionReasons, Msg: "name at least one of " + textfmt.Join(Removable, ", ")}
	}
	if len(out) > 1 && slices.Contains(out, decode.ReasonOrphaned) {
		return nil, &OptionError{Option: OptionReasons, Value: string(decode.ReasonOrphaned), Msg: "quarantine orphaned keys in a run of their own (they belong to no resource)"}
	}
	return out, nil
}

// Options control a quarantine.
type Options struct {
	// Reasons to remove objects for (required; see Removable).
	Reasons []decode.Reason
	DryRun  bool
	// Journal is the file the removed values are recorded in (required unless DryRun).
	Journal string
	// Snapshot, when set, is where an etcd snapshot is saved before the first removal.
	Snapshot string
	// SaveSnapshot, when set, saves Snapshot instead of etcd's own
	// snapshot (guard.FirstWrite's Save: a SQLite datastore's copy).
	SaveSnapshot func(ctx context.Context, path string) (undo.FileSum, error)
	// OnPreflight, when set, is given the checks passed before the first
	// removal (the run directory's plan); an error stops the run.
	OnPreflight func(checks []string) error
	// Lock, when set, is the writing run's lock, taken at the first removal
	// before the snapshot starts (guard.FirstWrite.Lock).
	Lock func(context.Context) error
	// Watch, when set, is the writing run's liveness watch (the caller's,
	// which it closes); nil: the run starts its own (none with
	// AllowLiveAPIServer or Output).
	Watch              *guard.Watch
	AllowLiveAPIServer bool
	// Output, when set, is where the removals go instead of etcd: the
	// output snapshot (OutputFile) of a snapshot file read in place
	// (env.Source), which no kube-apiserver reaches. The input is the undo:
	// no snapshot, no liveness watch, and a journal only when Journal is set.
	Output     guard.Store
	OutputFile string
	// StateDir, when set, is where a rollback of the run keeps its own undo:
	// its room is counted with the run's (guard.RunSpace).
	StateDir undo.StateDir
	// BatchOps is the number of deletes per transaction (default etcdscan.DefaultMaxOps).
	BatchOps int
	// LivenessWindow is how long the live-apiserver check watches etcd for
	// writes; 0 = liveness.DefaultWindow.
	LivenessWindow time.Duration
	// WriteContext is used for the deletes and the journal: it should outlive a
	// SIGINT so that a batch in flight finishes. nil = the run context.
	WriteContext context.Context
}

// Entry statuses.
const (
	StatusRemoved     = "removed"
	StatusWouldRemove = "would remove"
	StatusConflict    = "conflict"
	StatusFailed      = "failed"
	StatusKept        = "kept"
)

// Entry is one unreadable object of the selected resources.
type Entry struct {
	Key      string        `json:"key"`
	Resource string        `json:"resource"`
	Reason   decode.Reason `json:"reason"`
	// Orphan says why no resource owns an orphaned key.
	Orphan      decode.Orphan `json:"orphan,omitempty"`
	Detail      string        `json:"detail,omitempty"`
	Encryption  string        `json:"encryption,omitempty"`
	Bytes       int           `json:"bytes"`
	ModRevision int64         `json:"modRevision"`
	Lease       string        `json:"lease,omitempty"`
	Status      string        `json:"status"`
	// Note says why a kept object is kept, or why a removal did not happen.
	Note string `json:"note,omitempty"`

	encryption encryption.Info
}

// Result is what a quarantine found and did.
type Result struct {
	DryRun     bool               `json:"dryRun"`
	Revision   int64              `json:"revision"`
	Consistent bool               `json:"consistent"`
	Restarts   []etcdscan.Restart `json:"restarts,omitempty"`
	Reasons    []decode.Reason    `json:"reasons"`
	Prefixes   []string           `json:"prefixes"`
	Journal    string             `json:"journal,omitempty"`
	Preflight  []string           `json:"preflight,omitempty"`
	// Objects is the number of objects scanned, Unreadable those that did not
	// read, Orphaned the orphaned keys; each of those of the reasons named is
	// removed, would be, conflicted, failed or is kept.
	Objects     int64 `json:"objects"`
	Unreadable  int64 `json:"unreadable"`
	Orphaned    int64 `json:"orphaned,omitempty"`
	Removed     int64 `json:"removed"`
	WouldRemove int64 `json:"wouldRemove"`
	Conflicts   int64 `json:"conflicts"`
	Failed      int64 `json:"failed"`
	Kept        int64 `json:"kept"`
	// Entries lists every unreadable object (kept ones up to maxKeptListed).
	Entries     []Entry `json:"entries"`
	Interrupted bool    `json:"interrupted,omitempty"`
	Duration    string  `json:"duration"`
	// KeptUnlisted counts the kept objects beyond those listed.
	KeptUnlisted int64 `json:"-"`
	keptListed   int
}

// maxKeptListed bounds the kept objects listed (all are counted).
const maxKeptListed = 1000

// Run quarantines what env selects. env must have a resource filter
// (--resource). The result is complete even when err is set.
func Run(ctx context.Context, env *pipeline.Env, opts Options) (*Result, error) {
	start := time.Now()
	res := &Result{DryRun: opts.DryRun, Consistent: true, Reasons: opts.Reasons, Prefixes: env.Prefixes, Journal: opts.Journal, Entries: []Entry{}}
	defer func() { res.Duration = time.Since(start).Round(time.Millisecond).String() }()
	switch {
	case len(opts.Reasons) == 0:
		return res, &OptionError{Option: OptionReasons, Msg: "name at least one of " + textfmt.Join(Removable, ", ")}
	case OnlyOrphaned(opts.Reasons) && env.Filter != nil:
		return res, &OptionError{Option: OptionResources, Msg: "orphaned keys belong to no resource; select none (the whole prefix is scanned, only orphaned keys are removed)", Value: ""}
	case env.Filter == nil && !OnlyOrphaned(opts.Reasons):
		return res, &OptionError{Option: OptionResources, Msg: "name the resource(s) to quarantine objects of (quarantine never works on every resource at once)"}
	case env.Config.Revision != 0:
		return res, &OptionError{Option: OptionRevision, Value: strconv.FormatInt(env.Config.Revision, 10), Msg: "quarantine reads and writes the current revision; a past revision is for the read-only commands"}
	case !opts.DryRun && opts.Journal == "" && opts.Output == nil:
		return res, &OptionError{Option: OptionJournal, Msg: "required (the removed values are recorded there, for rollback), unless a dry run"}
	}
	writeCtx := opts.WriteContext
	if writeCtx == nil {
		writeCtx = ctx
	}

	watch := opts.Watch
	if !opts.DryRun && opts.Output == nil {
		// The liveness window runs while the objects are read; the first
		// removal waits for its verdict, and another writer stops the run.
		popts := guard.PreflightOptions{AllowLiveAPIServer: opts.AllowLiveAPIServer, LivenessWindow: opts.LivenessWindow}
		if watch == nil {
			var err error
			if watch, err = guard.StartWatch(ctx, env.Client, env.Resolver.Prefix(), popts); err != nil {
				return res, err
			}
			defer watch.Close()
		}
		checks, err := guard.PreflightOffline(ctx, env, popts)
		res.Preflight = checks
		if err != nil {
			return res, err
		}
	}

	// Pass 1: find the unreadable objects. Values are not kept: a candidate is
	// read again, and decoded again, right before it is removed.
	var candidates []*Entry
	refused := map[string]bool{} // provider:key that a configured key or plugin refused
	stats, scanErr := env.Run(ctx, 0, pipeline.DecodeOnly, func(page []reencode.Decision) error {
		for i := range page {
			d := &page[i]
			if d.Status == reencode.NotObject {
				continue
			}
			res.Objects++
			if d.Status == reencode.Readable {
				continue
			}
			e := entryOf(d)
			if d.Status == reencode.Orphaned {
				res.Orphaned++
			} else {
				res.Unreadable++
			}
			switch {
			case OnlyOrphaned(opts.Reasons) && d.Status != reencode.Orphaned:
				// The whole prefix is scanned: the unreadable objects of every
				// resource are counted, not listed.
			case !slices.Contains(opts.Reasons, e.Reason):
				res.keep(e, "its reason is not among those named")
			case e.Orphan == decode.OrphanAggregated:
				res.keep(e, "an APIService sends its group to an aggregated API server, which may still use it: remove that APIService first if the server is gone for good")
			case e.Reason == decode.ReasonUndecryptable && env.Encryption.CanRead(d.Resource, e.encryption):
				refused[e.encryption.String()] = true
				res.keep(e, fmt.Sprintf("the configured %s refused it (wrong key material, or a KMS plugin error): fix the key or the plugin, or remove it from the configuration to quarantine such objects", e.encryption))
			default:
				candidates = append(candidates, e)
			}
		}
		return nil
	})
	res.Revision, res.Consistent, res.Restarts = stats.Revision, stats.Consistent, stats.Restarts
	if scanErr != nil {
		if ctx.Err() != nil {
			res.Interrupted = true
			return res.finish(), errors.New("interrupted before anything was removed")
		}
		return res.finish(), fmt.Errorf("quarantine: scan %s: %w", strings.Join(env.Prefixes, ", "), scanErr)
	}
	// A key that refused values may also have "decrypted" others to garbage.
	var remove []*Entry
	for _, e := range candidates {
		if e.encryption.Provider != encryption.ProviderIdentity && refused[e.encryption.String()] && e.Reason != decode.ReasonUndecryptable && e.Reason != decode.ReasonCorruptEnvelope {
			res.keep(e, fmt.Sprintf("the configured %s refused other values: this one likely decrypted to garbage with wrong key material", e.encryption))
			continue
		}
		remove = append(remove, e)
	}
	if opts.DryRun {
		for _, e := range remove {
			e.Status = StatusWouldRemove
			res.WouldRemove++
			res.Entries = append(res.Entries, *e)
		}
		return res.finish(), nil
	}
	if len(remove) == 0 {
		return res.finish(), nil
	}

	// Before the first removal: room for the undo, the liveness window's
	// verdict and the snapshot (saved while the window ends), the plan.
	var journal *undo.Journal
	var w guard.Store
	if opts.Output != nil {
		w = opts.Output
		var err error
		if journal, err = beforeFirstOutput(env, opts, res); err != nil {
			return res.finish(), err
		}
		if journal != nil {
			defer journal.Close()
		}
	} else {
		var err error
		if journal, err = beforeFirstRemoval(ctx, env, opts, watch, remove, res); err != nil {
			return res.finish(), err
		}
		defer journal.Close()
		w = guard.EtcdStore{Writer: &etcdscan.Writer{Client: env.Client, MaxOps: opts.BatchOps, Observer: watch.Observer(), Kine: env.Target.APIServer().OnKine()}}
	}
	// Pass 2: journal and remove, a batch at a time.
	batch := opts.BatchOps
	if batch <= 0 {
		batch = etcdscan.DefaultMaxOps
	}
	var err error
	for len(remove) > 0 && err == nil {
		if ctx.Err() != nil {
			res.Interrupted = true
			for _, e := range remove {
				res.keep(e, "not reached: interrupted")
			}
			err = errors.New("interrupted: the batches in flight finished; run again to go on")
			break
		}
		if err = watch.Stopped(); err != nil {
			for _, e := range remove {
				res.keep(e, "not reached: another writer appeared")
			}
			break // no new batch
		}
		n := min(batch, len(remove))
		err = removeBatch(writeCtx, env, w, journal, remove[:n], res)
		remove = remove[n:]
	}
	// Every removal, up to the last, is judged: a writer that appeared is
	// the run's outcome.
	var we *liveness.WriterError
	if serr := watch.Settle(writeCtx); serr != nil && (err == nil || errors.As(serr, &we)) {
		err = serr
	}
	return res.finish(), err
}

// beforeFirstRemoval checks that the snapshot and the journal fit on their
// filesystems (with etcd's growth and a rollback's own undo: guard.RunSpace),
// then saves the snapshot while the liveness window ends, waits for the
// window's verdict, hands the checks to OnPreflight and opens the journal.
func beforeFirstRemoval(ctx context.Context, env *pipeline.Env, opts Options, watch *guard.Watch, remove []*Entry, res *Result) (*undo.Journal, error) {
	st, err := etcdscan.Status(ctx, env.Client)
	if err != nil {
		return nil, err
	}
	// Each removal adds a tombstone to etcd's backend; a rollback puts
	// each value back, journaling a re-creation.
	space := guard.RunSpace{Snapshot: opts.Snapshot, Journal: opts.Journal, StateDir: opts.StateDir, Status: st, Quota: 1 << 62}
	for _, e := range remove {
		space.JournalBytes += undo.JournalRecordBytes(e.Key, e.Bytes)
		space.Writes += guard.PutCost(e.Key, nil)
		space.RollbackWrites += guard.PutCostSize(len(e.Key), e.Bytes)
		space.RollbackJournalBytes += undo.JournalRecordBytes(e.Key, 0)
	}
	space.Etcd = guard.FindEtcdData(env.Target.APIServer().Manifest, guard.EtcdDataOf(env.Target.APIServer()))
	lines, err := guard.CheckDiskSpace(space.Needs())
	res.Preflight = append(res.Preflight, lines...)
	if err != nil {
		var se *guard.DiskSpaceError
		if errors.As(err, &se) {
			return nil, &guard.PreflightError{Err: se}
		}
		return nil, err
	}
	if space.Etcd.Dir == "" {
		res.Preflight = append(res.Preflight, "etcd's data directory on this host: "+space.Etcd.Source+"; its growth is not counted")
	}
	var journal *undo.Journal
	first := &guard.FirstWrite{Watch: watch, Client: env.Client, Snapshot: opts.Snapshot, Save: opts.SaveSnapshot, Lock: opts.Lock, Then: func(line string) error {
		if line != "" {
			res.Preflight = append(res.Preflight, line)
		}
		if opts.OnPreflight != nil {
			if err := opts.OnPreflight(res.Preflight); err != nil {
				return err
			}
		}
		j, err := undo.BeginJournal(opts.Journal, "quarantine", res.Revision, env.Resolver.Prefix())
		journal = j
		return err
	}}
	if err := first.Open(ctx); err != nil {
		return nil, err
	}
	return journal, nil
}

// beforeFirstOutput is the preflight of a quarantine that writes an output
// snapshot (opts.Output): room for it on its filesystem; the input, read in
// place and never modified, is the undo. The checks go to OnPreflight; the
// journal, when one is asked for (opts.Journal), records the removals as
// on etcd (nil: none).
func beforeFirstOutput(env *pipeline.Env, opts Options, res *Result) (*undo.Journal, error) {
	lines, err := guard.OutputSpace(env.Config.SnapshotFile, opts.OutputFile, guard.PreflightOptions{})
	res.Preflight = append(res.Preflight, lines...)
	if err != nil {
		return nil, err
	}
	if opts.OnPreflight != nil {
		if err := opts.OnPreflight(res.Preflight); err != nil {
			return nil, err
		}
	}
	if opts.Journal == "" {
		return nil, nil
	}
	return undo.BeginJournal(opts.Journal, "quarantine", res.Revision, env.Resolver.Prefix())
}

func entryOf(d *reencode.Decision) *Entry {
	reason, detail := d.ErrorReason()
	e := &Entry{
		Key: d.Key, Resource: d.Resource.String(), Reason: reason, Detail: detail, Encryption: d.From.Encryption,
		Bytes: d.OldSize, ModRevision: d.ModRevision,
	}
	if d.Err != nil {
		e.Orphan = d.Err.Orphan
	}
	if d.Status == reencode.Orphaned {
		e.Resource = ""
	}
	if d.Lease != 0 {
		e.Lease = fmt.Sprintf("%016x", d.Lease)
	}
	// encryption.Info.String is provider[:key]; provider names have no ':'.
	provider, key, _ := strings.Cut(d.From.Encryption, ":")
	e.encryption = encryption.Info{Provider: provider, KeyName: key}
	return e
}

func (r *Result) keep(e *Entry, note string) {
	r.Kept++
	if r.keptListed >= maxKeptListed {
		r.KeptUnlisted++
		return
	}
	r.keptListed++
	e.Status, e.Note = StatusKept, note
	r.Entries = append(r.Entries, *e)
}

func (r *Result) finish() *Result {
	sort.SliceStable(r.Entries, func(i, j int) bool { return r.Entries[i].Key < r.Entries[j].Key })
	return r
}

// removeBatch reads each entry again, checks it is the value decided on and
// still unreadable for the same reason, journals it and deletes it with
// compare-and-swap on its mod revision.
func removeBatch(ctx context.Context, env *pipeline.Env, w guard.Store, j *undo.Journal, es []*Entry, res *Result) error {
	var intents []undo.DeleteIntent
	var dels []etcdscan.Put
	var pending []*Entry
	for _, e := range es {
		kv, found, err := w.Get(ctx, e.Key)
		if err != nil {
			return fmt.Errorf("quarantine: read %s: %w (nothing of this batch was removed)", e.Key, err)
		}
		if !found || kv.ModRevision != e.ModRevision {
			e.Status, e.Note = StatusConflict, "changed or deleted since it was read: left alone (run again to see it)"
			res.Conflicts++
			res.Entries = append(res.Entries, *e)
			continue
		}
		d := env.DecideOne(ctx, kv, pipeline.DecodeOnly)
		if (d.Status != reencode.Unreadable && d.Status != reencode.Orphaned) || d.Err == nil || d.Err.Reason != e.Reason {
			res.keep(e, fmt.Sprintf("read again, it is %s: left alone", d.Status))
			continue
		}
		intents = append(intents, undo.DeleteIntent{Key: e.Key, Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision,
			Version: kv.Version, Lease: kv.Lease, Reason: string(e.Reason)})
		dels = append(dels, etcdscan.Put{Key: e.Key, ModRevision: kv.ModRevision, Read: kv.Meta(), Delete: true})
		pending = append(pending, e)
	}
	if len(dels) == 0 {
		return nil
	}
	if j != nil {
		if err := j.DeleteIntents(intents); err != nil {
			return fmt.Errorf("%w (nothing of this batch was removed)", err)
		}
	}
	results := w.Write(ctx, dels)
	if j != nil {
		if err := j.Deleted(results); err != nil {
			return err
		}
	}
	for i, r := range results {
		e := pending[i]
		switch r.Status {
		case etcdscan.Written:
			e.Status = StatusRemoved
			res.Removed++
		case etcdscan.Conflict:
			e.Status, e.Note = StatusConflict, "changed since it was read: left alone (run again to see it)"
			res.Conflicts++
		case etcdscan.Failed:
			if errors.As(r.Err, new(*liveness.WriterError)) {
				res.keep(e, "not removed: another writer appeared")
				continue
			}
			fallthrough
		default:
			e.Status, e.Note = StatusFailed, fmt.Sprint(r.Err)
			res.Failed++
		}
		res.Entries = append(res.Entries, *e)
	}
	return nil
}
