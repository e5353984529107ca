package rollback

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/undo"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/liveness"
)

// currentKV is a key as it is (or, in a dry run, would be) now.
type currentKV struct {
	value                                []byte
	modRevision, createRevision, version int64
	lease                                int64
	simSum                               *[32]byte // a dry run's value instead of value
}

func (c *currentKV) sum() [32]byte {
	if c.simSum != nil {
		return *c.simSum
	}
	return sha256.Sum256(c.value)
}

func (c *currentKV) equal(v []byte) bool {
	if c.simSum != nil {
		return *c.simSum == sha256.Sum256(v)
	}
	return bytes.Equal(c.value, v)
}

// ours says whether the key holds what the record's write put there.
func (c *currentKV) ours(it item) bool {
	if c.simSum == nil && it.doneRev != 0 && c.modRevision == it.doneRev {
		return true
	}
	if it.rec.NewSHA256 == "" {
		return false
	}
	s := c.sum()
	return hex.EncodeToString(s[:]) == it.rec.NewSHA256
}

// restore is one write a batch sends, with what the rollback's journal records.
type restore struct {
	put    etcdscan.Put
	record undo.JournalRecord
	note   string
}

// batch decides and writes one batch, and adds what it did to the
// rollback's result.
func (rb *rollback) batch(items []item) error {
	var res RollbackResult
	defer func() {
		rb.mu.Lock()
		defer rb.mu.Unlock()
		rb.res.add(&res)
		for _, it := range items {
			if rb.busy[it.rec.Key]--; rb.busy[it.rec.Key] <= 0 {
				delete(rb.busy, it.rec.Key)
			}
		}
	}()
	return rb.decideAndWrite(items, &res)
}

func (rb *rollback) decideAndWrite(items []item, res *RollbackResult) error {
	if len(items) == 0 {
		return nil
	}
	cur, err := rb.current(items)
	if err != nil {
		return err
	}
	var undos []restore
	for i, it := range items {
		if u, ok, err := rb.decide(it, cur[i], res); err != nil {
			return err
		} else if ok {
			undos = append(undos, u)
		}
	}
	if len(undos) == 0 {
		return nil
	}
	if rb.opts.DryRun {
		for _, u := range undos {
			res.Restored++
			switch {
			case u.put.Delete:
				rb.sim[u.put.Key] = simValue{absent: true}
			default:
				rb.sim[u.put.Key] = simValue{sum: sha256.Sum256(u.put.Value)}
			}
		}
		return nil
	}
	// The first write waits for the liveness window's verdict and the
	// snapshot; none is sent once another writer was seen.
	if err := rb.first.Open(rb.ctx); err != nil {
		return err
	}
	if err := rb.opts.Watch.Stopped(); err != nil {
		return err
	}
	if j := rb.opts.Journal; j != nil {
		recs := make([]undo.JournalRecord, len(undos))
		for i, u := range undos {
			recs[i] = u.record
		}
		if err := j.Append(true, recs...); err != nil {
			return fmt.Errorf("rollback: %w (nothing of this batch was written)", err)
		}
	}
	puts := make([]etcdscan.Put, len(undos))
	var cost int64
	for i, u := range undos {
		puts[i] = u.put
		cost += guard.PutCost(u.put.Key, u.put.Value)
	}
	if rb.guard != nil {
		if err := rb.guard.Reserve(rb.ctx, cost); err != nil {
			return err
		}
	}
	out := rb.w.Write(rb.ctx, puts)
	if rb.guard != nil {
		rb.guard.Done(cost)
	}
	if rb.opts.Journal != nil {
		var done []undo.JournalRecord
		for i, r := range out {
			if r.Status == etcdscan.Written {
				op := "done"
				if puts[i].Delete {
					op = "deleted"
				}
				done = append(done, undo.JournalRecord{Op: op, Key: r.Key, NewModRevision: r.NewModRevision})
			}
		}
		if err := rb.opts.Journal.Append(false, done...); err != nil {
			return fmt.Errorf("rollback: %w", err)
		}
	}
	for i, r := range out {
		switch r.Status {
		case etcdscan.Written:
			res.Restored++
			if undos[i].note != "" {
				res.Notes = append(res.Notes, undos[i].note)
			}
		case etcdscan.Conflict:
			res.Skipped++
			res.listKey("skipped", r.Key, "changed during rollback")
		default:
			if errors.As(r.Err, new(*liveness.WriterError)) {
				continue // not sent: another writer stopped the rollback (its error says so)
			}
			if puts[i].Lease != 0 && etcdscan.IsLeaseNotFound(r.Err) {
				// The lease expired between the check and the write.
				p := puts[i]
				p.Lease = 0
				again := rb.w.Write(rb.ctx, []etcdscan.Put{p})
				if again[0].Status == etcdscan.Written {
					res.Restored++
					res.Notes = append(res.Notes, fmt.Sprintf("%s: restored without its lease %016x, which expired", p.Key, puts[i].Lease))
					continue
				}
				r = again[0]
			}
			res.Failed++
			res.listKey("failed", r.Key, guard.WriteCause(r.Err), r.Err)
		}
	}
	if key, fe := guard.FirstFatal(out); fe != nil {
		return guard.NewStopError(rb.ctx, fe, key, rb.path, "rollback", func(ctx context.Context) ([]string, error) { return etcdscan.Alarms(ctx, rb.cli) })
	}
	return nil
}

// decide says what undoing one record writes, if anything.
func (rb *rollback) decide(it item, cur *currentKV, res *RollbackResult) (restore, bool, error) {
	r := it.rec
	switch r.Op {
	case "delete-intent":
		// The tool removed the key: create it again if it is still absent.
		if cur != nil {
			if cur.equal(r.OldValue) {
				res.Unchanged++ // never removed, or already restored
			} else {
				res.Skipped++
				res.listKey("skipped", r.Key, "created again or changed since it was removed")
			}
			return restore{}, false, nil
		}
		lease, note := r.Lease, ""
		// On kine a lease is the key's TTL in seconds, nothing that
		// expires (kine keeps no leases, and refuses to tell one's TTL).
		if lease != 0 && !rb.w.Kine {
			ttl, err := rb.cli.TimeToLive(rb.ctx, clientv3.LeaseID(lease))
			if err != nil {
				return restore{}, false, fmt.Errorf("rollback %s: lease %016x: %w", r.Key, lease, err)
			}
			if ttl.TTL <= 0 {
				note = fmt.Sprintf("%s: restored without its lease %016x, which expired", r.Key, lease)
				lease = 0
			}
		}
		sum := sha256.Sum256(r.OldValue)
		return restore{
			put:    etcdscan.Put{Key: r.Key, Value: r.OldValue, Lease: lease},
			record: undo.JournalRecord{Op: "create-intent", Key: r.Key, NewSHA256: hex.EncodeToString(sum[:]), Lease: lease},
			note:   note,
		}, true, nil
	case "create-intent":
		// A rollback created the key again: remove it if it still holds that.
		if cur == nil {
			res.Unchanged++
			return restore{}, false, nil
		}
		if !cur.ours(it) {
			res.Skipped++
			res.listKey("skipped", r.Key, "changed since the rollback created it again")
			return restore{}, false, nil
		}
		return restore{
			put: etcdscan.Put{Key: r.Key, ModRevision: cur.modRevision, Delete: true},
			record: undo.JournalRecord{Op: "delete-intent", Key: r.Key, OldValue: cur.value, OldModRevision: cur.modRevision,
				OldCreateRevision: cur.createRevision, OldVersion: cur.version, Lease: cur.lease, Reason: "rollback"},
		}, true, nil
	}
	// An overwrite: put the old bytes back if the key holds what the tool wrote.
	if cur == nil {
		res.Skipped++
		res.listKey("skipped", r.Key, "deleted since")
		return restore{}, false, nil
	}
	if (cur.simSum == nil && cur.modRevision == r.OldModRevision) || cur.equal(r.OldValue) {
		res.Unchanged++
		return restore{}, false, nil
	}
	if !cur.ours(it) {
		res.Skipped++
		res.listKey("skipped", r.Key, "changed since the tool wrote it")
		return restore{}, false, nil
	}
	sum := sha256.Sum256(r.OldValue)
	return restore{
		put: etcdscan.Put{Key: r.Key, Value: r.OldValue, ModRevision: cur.modRevision,
			Read: etcdscan.KVMeta{CreateRevision: cur.createRevision, Version: cur.version, Lease: cur.lease}},
		record: undo.JournalRecord{Op: "intent", Key: r.Key, OldModRevision: cur.modRevision, OldValue: cur.value, NewSHA256: hex.EncodeToString(sum[:])},
	}, true, nil
}
