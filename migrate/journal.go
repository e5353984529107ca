package migrate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
)

// JournalRecord is one line of a journal (JSON lines). An "intent" record is
// written and synced before the write is sent; a "done" record after it landed.
// A delete (quarantine) is journaled the same way as "delete-intent", with the
// key's lease and revisions, and "deleted". OldValue holds the stored bytes
// exactly as they were, still encrypted if they were: a journal of
// identity-stored secrets holds those secrets, hence mode 0600. Readers ignore
// fields and ops they do not know.
type JournalRecord struct {
	Op             string `json:"op"` // "begin", "intent", "done", "delete-intent", "deleted"
	Key            string `json:"key,omitempty"`
	OldModRevision int64  `json:"oldModRevision,omitempty"`
	OldValue       []byte `json:"oldValue,omitempty"`
	// NewSHA256 identifies the value the tool wrote, so a rollback can tell its own
	// write from someone else's when the "done" record is missing (crash).
	NewSHA256      string `json:"newSha256,omitempty"`
	NewModRevision int64  `json:"newModRevision,omitempty"`
	// Begin record fields. Command is "quarantine" for a quarantine's journal,
	// absent for migrate's.
	Revision int64  `json:"revision,omitempty"`
	Prefix   string `json:"prefix,omitempty"`
	Command  string `json:"command,omitempty"`
	// Delete records: what etcd kept with the value, and why it was removed.
	OldCreateRevision int64  `json:"oldCreateRevision,omitempty"`
	OldVersion        int64  `json:"oldVersion,omitempty"`
	Lease             int64  `json:"lease,omitempty"`
	Reason            string `json:"reason,omitempty"`
	DeleteRevision    int64  `json:"deleteRevision,omitempty"`
}

// Journal appends records to a file, syncing each batch of intents before the
// batch is written.
type Journal struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
}

// OpenJournal creates (or appends to) a journal file with mode 0600.
func OpenJournal(path string) (*Journal, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--journal %s: %w", path, err)
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		f.Close()
		return nil, fmt.Errorf("--journal %s: file is readable by others (mode %v); it will hold stored values, use a file with mode 0600", path, fi.Mode().Perm())
	}
	w := bufio.NewWriterSize(f, 1<<20)
	return &Journal{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Begin records the start of a run.
func (j *Journal) Begin(revision int64, prefix string) error {
	return j.append(true, JournalRecord{Op: "begin", Revision: revision, Prefix: prefix})
}

// BeginCommand records the start of a run of another command than migrate.
func (j *Journal) BeginCommand(command string, revision int64, prefix string) error {
	return j.append(true, JournalRecord{Op: "begin", Command: command, Revision: revision, Prefix: prefix})
}

// DeleteIntent is a key about to be deleted, as it is stored.
type DeleteIntent struct {
	Key                                  string
	Value                                []byte
	ModRevision, CreateRevision, Version int64
	Lease                                int64
	Reason                               string
}

// DeleteIntents records, durably, the keys of a batch about to be deleted:
// value, lease and revisions.
func (j *Journal) DeleteIntents(ds []DeleteIntent) error {
	recs := make([]JournalRecord, len(ds))
	for i, d := range ds {
		recs[i] = JournalRecord{Op: "delete-intent", Key: d.Key, OldValue: d.Value, OldModRevision: d.ModRevision,
			OldCreateRevision: d.CreateRevision, OldVersion: d.Version, Lease: d.Lease, Reason: d.Reason}
	}
	return j.append(true, recs...)
}

// Deleted records deletes that landed. It is synced by the next intents or Close.
func (j *Journal) Deleted(results []etcdscan.PutResult) error {
	var recs []JournalRecord
	for _, r := range results {
		if r.Status == etcdscan.Written {
			recs = append(recs, JournalRecord{Op: "deleted", Key: r.Key, DeleteRevision: r.NewModRevision})
		}
	}
	return j.append(false, recs...)
}

// Intents records, durably, the old values of a batch about to be written.
func (j *Journal) Intents(puts []etcdscan.Put, old [][]byte) error {
	recs := make([]JournalRecord, len(puts))
	for i, p := range puts {
		sum := sha256.Sum256(p.Value)
		recs[i] = JournalRecord{Op: "intent", Key: p.Key, OldModRevision: p.ModRevision, OldValue: old[i], NewSHA256: hex.EncodeToString(sum[:])}
	}
	return j.append(true, recs...)
}

// Done records writes that landed. It is synced by the next Intents or Close.
func (j *Journal) Done(results []etcdscan.PutResult) error {
	var recs []JournalRecord
	for _, r := range results {
		if r.Status == etcdscan.Written {
			recs = append(recs, JournalRecord{Op: "done", Key: r.Key, NewModRevision: r.NewModRevision})
		}
	}
	return j.append(false, recs...)
}

func (j *Journal) append(sync bool, recs ...JournalRecord) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, r := range recs {
		if err := j.enc.Encode(r); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
	}
	if !sync {
		return nil
	}
	if err := j.w.Flush(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// Close flushes and syncs the journal.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.w.Flush()
	if serr := j.f.Sync(); err == nil {
		err = serr
	}
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// RollbackResult counts what a rollback did.
type RollbackResult struct {
	Restored  int      `json:"restored"`
	Unchanged int      `json:"unchanged"` // never written (intent without effect)
	Skipped   int      `json:"skipped"`   // changed since the tool wrote it: left alone
	Failed    int      `json:"failed"`
	Keys      []string `json:"skippedKeys,omitempty"`
	// Notes are keys restored with a difference: a deleted key whose lease
	// expired since comes back without a lease.
	Notes []string `json:"notes,omitempty"`
}

type journalEntry struct {
	intent JournalRecord
	done   *JournalRecord
}

// Rollback puts back the old bytes of every key the journal says the tool wrote,
// with compare-and-swap on the mod revision the tool's write produced: a key
// changed since is skipped and listed. Leases are kept. A key the tool deleted
// (quarantine) is created again if it is still absent, with its lease if that
// is still alive (without, and noted, if it expired). Within a journal holding
// several runs, the earliest old value of a key wins (the state before the first run).
func Rollback(ctx context.Context, cli *clientv3.Client, path string, w *etcdscan.Writer) (RollbackResult, error) {
	var res RollbackResult
	f, err := os.Open(path)
	if err != nil {
		return res, fmt.Errorf("--journal %s: %w", path, err)
	}
	defer f.Close()
	entries := map[string][]*journalEntry{}
	var order []string
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	line := 0
	for {
		var r JournalRecord
		err := dec.Decode(&r)
		if errors.Is(err, io.EOF) {
			break
		}
		line++
		if err != nil {
			// A torn last record (crash while appending) ends the usable journal.
			if errors.Is(err, io.ErrUnexpectedEOF) {
				break
			}
			return res, fmt.Errorf("--journal %s: record %d: %w", path, line, err)
		}
		switch r.Op {
		case "intent", "delete-intent":
			if _, ok := entries[r.Key]; !ok {
				order = append(order, r.Key)
			}
			entries[r.Key] = append(entries[r.Key], &journalEntry{intent: r})
		case "done", "deleted":
			list := entries[r.Key]
			if len(list) == 0 {
				return res, fmt.Errorf("--journal %s: record %d: %s for %s without intent", path, line, r.Op, r.Key)
			}
			rec := r
			list[len(list)-1].done = &rec
		}
	}
	// Rollback writes too: under an alarm etcd would refuse every key.
	alarms, err := etcdscan.Alarms(ctx, cli)
	if err != nil {
		return res, err
	}
	if len(alarms) > 0 {
		return res, fmt.Errorf("rollback writes too, and etcd has active alarms: %s; make room first ('etcdctl compact REV' at the current revision, 'etcdctl defrag' on every member, then 'etcdctl alarm disarm'; or raise etcd's --quota-backend-bytes), then run the same rollback again (nothing was written; the journal %s is unchanged)", strings.Join(alarms, "; "), path)
	}
	stopped := func(out []etcdscan.PutResult) error {
		if key, fe := firstFatalKey(out); fe != nil {
			return stopErr(ctx, fe, key, path, "rollback", func(ctx context.Context) ([]string, error) { return etcdscan.Alarms(ctx, cli) })
		}
		return nil
	}
	for _, key := range order {
		list := entries[key]
		if last := list[len(list)-1]; last.intent.Op == "delete-intent" {
			if err := restoreDeleted(ctx, cli, w, key, list[0].intent.OldValue, last.intent.Lease, &res); err != nil {
				return res, err
			}
			if fe := w.Stopped(); fe != nil {
				return res, stopErr(ctx, fe, key, path, "rollback", func(ctx context.Context) ([]string, error) { return etcdscan.Alarms(ctx, cli) })
			}
			continue
		}
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return res, fmt.Errorf("rollback %s: %w", key, err)
		}
		if len(resp.Kvs) == 0 {
			res.Skipped++
			res.Keys = append(res.Keys, key+" (deleted since)")
			continue
		}
		cur := resp.Kvs[0]
		first := list[0]
		// Never written, or already back to the old bytes (an intent whose write
		// did not land, later rewritten and rolled back by a later run's journal).
		if cur.ModRevision == first.intent.OldModRevision || bytes.Equal(cur.Value, first.intent.OldValue) {
			res.Unchanged++
			continue
		}
		// The key must hold what one of the tool's writes put there.
		sum := sha256.Sum256(cur.Value)
		curSum := hex.EncodeToString(sum[:])
		ours := false
		for _, e := range list {
			if (e.done != nil && cur.ModRevision == e.done.NewModRevision) || (e.done == nil && curSum == e.intent.NewSHA256) {
				ours = true
			}
		}
		if !ours {
			res.Skipped++
			res.Keys = append(res.Keys, key+" (changed since the migration wrote it)")
			continue
		}
		out := w.Write(ctx, []etcdscan.Put{{Key: key, Value: first.intent.OldValue, ModRevision: cur.ModRevision}})
		if err := stopped(out); err != nil {
			res.Failed++
			return res, err
		}
		switch out[0].Status {
		case etcdscan.Written:
			res.Restored++
		case etcdscan.Conflict:
			res.Skipped++
			res.Keys = append(res.Keys, key+" (changed during rollback)")
		default:
			res.Failed++
			res.Keys = append(res.Keys, fmt.Sprintf("%s (%v)", key, out[0].Err))
		}
	}
	return res, nil
}

// restoreDeleted creates key again with old, if it is absent, attached to lease
// if that is still alive.
func restoreDeleted(ctx context.Context, cli *clientv3.Client, w *etcdscan.Writer, key string, old []byte, lease int64, res *RollbackResult) error {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("rollback %s: %w", key, err)
	}
	if len(resp.Kvs) > 0 {
		if bytes.Equal(resp.Kvs[0].Value, old) {
			res.Unchanged++ // never deleted, or already restored
		} else {
			res.Skipped++
			res.Keys = append(res.Keys, key+" (created again or changed since it was removed)")
		}
		return nil
	}
	var note string
	if lease != 0 {
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(lease))
		if err != nil {
			return fmt.Errorf("rollback %s: lease %016x: %w", key, lease, err)
		}
		if ttl.TTL <= 0 {
			note = fmt.Sprintf("%s: restored without its lease %016x, which expired", key, lease)
			lease = 0
		}
	}
	out := w.Write(ctx, []etcdscan.Put{{Key: key, Value: old, Lease: lease}})
	if out[0].Status == etcdscan.Failed && lease != 0 && errors.Is(out[0].Err, rpctypes.ErrLeaseNotFound) {
		note = fmt.Sprintf("%s: restored without its lease %016x, which expired", key, lease)
		out = w.Write(ctx, []etcdscan.Put{{Key: key, Value: old}})
	}
	switch out[0].Status {
	case etcdscan.Written:
		res.Restored++
		if note != "" {
			res.Notes = append(res.Notes, note)
		}
	case etcdscan.Conflict:
		res.Skipped++
		res.Keys = append(res.Keys, key+" (created during rollback)")
	default:
		res.Failed++
		res.Keys = append(res.Keys, fmt.Sprintf("%s (%v)", key, out[0].Err))
	}
	return nil
}
