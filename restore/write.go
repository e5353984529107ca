package restore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apiserver/pkg/storage/etcd3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/undo"
)

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
	w := &etcdscan.Writer{Client: r.env.Client, MaxOps: r.opts.BatchOps, Observer: watch.Observer(), Kine: r.env.Target.APIServer().OnKine()}
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
	if r.space != nil {
		r.space.Finish(context.WithoutCancel(writeCtx))
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
	space := guard.RunSpace{Snapshot: r.opts.Snapshot, Journal: r.opts.Journal, StateDir: r.opts.StateDir, Status: st}
	for _, c := range todo {
		old := 0
		if c.live != nil {
			old = len(c.live.Value)
		}
		space.JournalBytes += undo.JournalRecordBytes(c.e.Key, old)
		space.Writes += guard.PutCostSize(len(c.e.Key), c.valueSize)
		space.RollbackWrites += guard.PutCostSize(len(c.e.Key), old)
		space.RollbackJournalBytes += undo.JournalRecordBytes(c.e.Key, c.valueSize)
	}
	space.Etcd = guard.FindEtcdData(r.env.Target.APIServer().Manifest, guard.EtcdDataOf(r.env.Target.APIServer()))
	// etcd's quota: what the restore writes must fit below it (the run
	// compacts nothing); the guard keeps it there as the batches go.
	quota := guard.QuotaOf(ctx, r.env.Client, r.env.Target.APIServer(), 0, nil)
	lines, err := guard.CheckWriteQuota(ctx, r.env.Client, quota, "restore", space.Writes)
	r.res.Preflight = append(r.res.Preflight, lines...)
	if err != nil {
		return nil, err
	}
	space.Quota = quota.Bytes
	r.space = guard.NewEtcdSpaceGuard(r.env.Client, quota, false, st)
	r.space.Watched(r.opts.Watch)
	lines, err = guard.CheckDiskSpace(space.Needs())
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
	first := &guard.FirstWrite{Watch: r.opts.Watch, Client: r.env.Client, Snapshot: r.opts.Snapshot, Save: r.opts.SaveSnapshot, Lock: r.opts.Lock, Then: func(line string) error {
		if line != "" {
			r.res.Preflight = append(r.res.Preflight, line)
		}
		if r.opts.OnPreflight != nil {
			if err := r.opts.OnPreflight(r.res.Preflight); err != nil {
				return err
			}
		}
		j, err := undo.BeginJournal(r.opts.Journal, "restore", rev, r.env.Resolver.Prefix())
		journal = j
		return err
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
		value, err := r.valueOf(ctx, c)
		if err != nil {
			return fmt.Errorf("%w (nothing of this batch was written)", err)
		}
		sum := sha256.Sum256(value)
		newSum := hex.EncodeToString(sum[:])
		if c.live == nil {
			p := etcdscan.Put{Key: c.e.Key, Value: value}
			if c.event {
				p.Lease = lease
			}
			puts[i] = p
			recs[i] = undo.JournalRecord{Op: "create-intent", Key: c.e.Key, NewSHA256: newSum, Lease: p.Lease}
			continue
		}
		puts[i] = etcdscan.Put{Key: c.e.Key, Value: value, ModRevision: c.live.ModRevision, Read: c.live.Meta()}
		recs[i] = undo.JournalRecord{Op: "intent", Key: c.e.Key, OldModRevision: c.live.ModRevision, OldValue: c.live.Value, NewSHA256: newSum}
	}
	var cost int64
	for _, p := range puts {
		cost += guard.PutCost(p.Key, p.Value)
	}
	if err := r.space.Reserve(ctx, cost); err != nil {
		return fmt.Errorf("restore: %w (nothing of this batch was written)", err)
	}
	defer r.space.Done(cost)
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

// valueOf is c's value as today's kube-apiserver stores it, encoded again
// from the backup (the plan kept only what it decrypts to: its sha256).
func (r *run) valueOf(ctx context.Context, c *candidate) ([]byte, error) {
	kv, found, err := r.opts.Backup.Get(ctx, c.e.Key, r.res.BackupRevision)
	if err != nil || !found {
		return nil, fmt.Errorf("backup %s: read %s again: found %v, %v", r.opts.BackupName, c.e.Key, found, err)
	}
	obj, err := r.dec.Decode(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %s decoded once, not again: %s", r.opts.BackupName, c.e.Key, reasonOf(err))
	}
	value, plain, note, err := r.encode(ctx, kv, c.gr, obj)
	switch {
	case err != nil:
		return nil, err
	case note != "":
		return nil, fmt.Errorf("backup %s: %s encoded once, not again: %s", r.opts.BackupName, c.e.Key, note)
	case sha256.Sum256(plain) != c.plainSum:
		return nil, fmt.Errorf("backup %s: %s encoded again differs from what was planned", r.opts.BackupName, c.e.Key)
	}
	return value, nil
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
