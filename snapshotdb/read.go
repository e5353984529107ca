package snapshotdb

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"kube-etcd-migrate/etcdscan"
)

var _ etcdscan.Source = (*File)(nil)

// windowBytes bounds the keys one pass keeps (their bytes plus a fixed cost
// per key; half as much again while the window fills): about 100,000
// Kubernetes keys. A variable for the tests.
var windowBytes = 12 << 20

// entryCost is what a key kept in a window costs beyond its bytes (map slot:
// string header and revision; the string's allocation rounded up).
const entryCost = 64

// latest is a key's newest record at or below the pass's revision.
type latest struct {
	main, sub int64
	tombstone bool
}

// window is the outcome of one pass: the keys of [lo, hi) that exist at the
// revision, in key order, with their record's revision. hi is "" when the
// pass reached the end of its range.
type window struct {
	keys []string
	revs []mvcc.Revision
	hi   string
	// total counts the keys of the whole range the pass was asked for (not
	// only the window's) that exist at the revision; -1 when unknown.
	total int64
}

// cached is the window of the last pass, kept until the next one: a command
// scans a few small ranges (CRDs, StorageVersionMigrations) and the whole
// keyspace at one revision, and a keyspace of up to one window's keys takes a
// single pass for all of them.
type cached struct {
	rev     int64
	lo, end string // the range the pass was asked for
	w       window
}

// covers returns the part of the cached window in [lo, end): the keys, and
// where a next window starts ("" when the cache answers the whole range).
func (c *cached) covers(rev int64, lo, end string) (window, bool) {
	if c == nil || c.rev != rev || lo < c.lo {
		return window{}, false
	}
	stop := c.w.hi // the cache knows every key of [c.lo, stop)
	if stop == "" {
		stop = c.end
	}
	if stop != "" && lo >= stop {
		return window{}, false
	}
	out := window{total: -1}
	if lo == c.lo && end == c.end {
		out.total = c.w.total
	}
	switch {
	case end != "" && (stop == "" || end <= stop):
		// All of [lo, end).
	default:
		out.hi, end = stop, stop
	}
	i := sort.SearchStrings(c.w.keys, lo)
	j := len(c.w.keys)
	if end != "" {
		j = sort.SearchStrings(c.w.keys, end)
	}
	out.keys, out.revs = c.w.keys[i:j], c.w.revs[i:j]
	return out, true
}

// window answers [lo, end) at rev from the cache, or with a new pass.
func (f *File) window(ctx context.Context, r *reader, rev int64, lo, end string) (window, error) {
	f.mu.Lock()
	c := f.cache
	f.mu.Unlock()
	if w, ok := c.covers(rev, lo, end); ok {
		return w, nil
	}
	f.mu.Lock()
	f.cache = nil // not held through the pass
	f.mu.Unlock()
	w, err := f.pass(ctx, r, rev, lo, end, windowBytes)
	if err != nil {
		return window{}, err
	}
	f.mu.Lock()
	f.cache = &cached{rev: rev, lo: lo, end: end, w: w}
	f.mu.Unlock()
	return w, nil
}

// pass reads every record at or below rev, in revision order, and keeps the
// newest of each key in [lo, end) ("" end: no end) — the smallest keys only,
// as many as budget allows: when more are seen, the greatest are dropped and
// the window ends before them (hi).
//
// The same walk counts the keys of the whole range that exist at rev
// (window.total), in constant memory, from what etcd writes: a key's life
// (etcd's generation) begins with a record of version 1 (etcd writes version 1
// for a key that does not exist) and ends with a tombstone; a compaction at C
// keeps, of each life still going on at C, its latest record at or below C,
// and nothing of a life that ended at or below C (mvcc's keyIndex.compact).
// So the keys at rev are the records at or below C that are not tombstones,
// plus the records above C of version 1, less the tombstones above C. A
// compaction scheduled but not finished may have left more below C: then the
// count is unknown (-1) and Count counts window by window.
func (f *File) pass(ctx context.Context, r *reader, rev int64, lo, end string, budget int) (window, error) {
	keys := map[string]latest{}
	var hi string // "": no bound yet
	size := 0
	var total int64
	compacted := f.Info.CompactRevision
	f.passes.Add(1)
	c := r.tx.Bucket(schema.Key.Name()).Cursor()
	n := 0
	for k, v := c.First(); k != nil; k, v = c.Next() {
		bk := mvcc.BytesToBucketKey(k)
		if bk.Main > rev {
			break
		}
		if n++; n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return window{}, err
			}
		}
		key, version, err := recordKey(v)
		if err != nil {
			return window{}, FileError(f.Info.Path, "damaged key record %x: %v", k, err)
		}
		inRange := string(key) >= lo && (end == "" || string(key) < end)
		if inRange {
			switch tomb := mvcc.IsTombstone(k); {
			case bk.Main <= compacted:
				if !tomb {
					total++
				}
			case tomb:
				total--
			case version == 1:
				total++
			}
		}
		// The comparisons and the lookup copy nothing; the assignment copies
		// the key (again, for a key written again: garbage, not growth).
		if inRange && (hi == "" || string(key) < hi) {
			if _, seen := keys[string(key)]; !seen {
				size += len(key) + entryCost
			}
			keys[string(key)] = latest{main: bk.Main, sub: bk.Sub, tombstone: mvcc.IsTombstone(k)}
			if size > budget+budget/2 {
				hi, size = shrink(keys, hi, budget)
			}
		}
		if r.account(len(k) + len(v)) {
			last := append([]byte(nil), k...)
			if err := r.release(); err != nil {
				return window{}, err
			}
			c = r.tx.Bucket(schema.Key.Name()).Cursor()
			k, v = c.Seek(last)
			if k == nil || string(k) != string(last) {
				return window{}, FileError(f.Info.Path, "changed while it was being read")
			}
			_ = v
		}
	}
	if size > budget {
		hi, _ = shrink(keys, hi, budget)
	}
	w := window{hi: hi, total: -1}
	if f.countable {
		w.total = total
	}
	for key, l := range keys {
		if !l.tombstone {
			w.keys = append(w.keys, key)
		}
	}
	sort.Strings(w.keys)
	w.revs = make([]mvcc.Revision, len(w.keys))
	for i, key := range w.keys {
		l := keys[key]
		w.revs[i] = mvcc.Revision{Main: l.main, Sub: l.sub}
	}
	return w, nil
}

// The numbers of mvccpb.KeyValue's key and version fields, from its own
// descriptor.
var (
	kvFields     = (&mvccpb.KeyValue{}).ProtoReflect().Descriptor().Fields()
	keyField     = kvFields.ByName("key").Number()
	versionField = kvFields.ByName("version").Number()
)

// recordKey returns the key and the version of a record of etcd's key bucket
// (an encoded mvccpb.KeyValue) without decoding the rest: a pass looks at the
// key of every record, and copying every value (what proto.Unmarshal does)
// would be most of its cost. The fields are walked with protobuf's own wire
// reader, up to the value (which etcd writes after them) when both are found.
func recordKey(v []byte) (key []byte, version int64, err error) {
	for len(v) > 0 && (key == nil || version == 0) {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return nil, 0, protowire.ParseError(n)
		}
		v = v[n:]
		switch {
		case num == keyField && typ == protowire.BytesType:
			b, n := protowire.ConsumeBytes(v)
			if n < 0 {
				return nil, 0, protowire.ParseError(n)
			}
			key, v = b, v[n:]
			continue
		case num == versionField && typ == protowire.VarintType:
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return nil, 0, protowire.ParseError(n)
			}
			version, v = int64(x), v[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, v)
		if n < 0 {
			return nil, 0, protowire.ParseError(n)
		}
		v = v[n:]
	}
	if key == nil {
		return nil, 0, fmt.Errorf("no key in the record")
	}
	return key, version, nil
}

// shrink keeps the smallest keys that fit in budget and returns the first key
// dropped (the window's new end; hi if none was) and the size kept.
func shrink(keys map[string]latest, hi string, budget int) (string, int) {
	all := make([]string, 0, len(keys))
	for k := range keys {
		all = append(all, k)
	}
	sort.Strings(all)
	size, i := 0, 0
	for ; i < len(all) && size+len(all[i])+entryCost <= budget; i++ {
		size += len(all[i]) + entryCost
	}
	if i == 0 {
		i, size = 1, len(all[0])+entryCost // one key always fits
	}
	if i == len(all) {
		return hi, size // nothing dropped
	}
	for _, k := range all[i:] {
		delete(keys, k)
	}
	return all[i], size
}

// faultAround is what Linux maps on a page fault of a file mapping (its
// default fault_around_bytes): the pages around the one read, if cached.
const faultAround = 64 << 10

// fetch reads the records of keys[i] at revs[i].
func (f *File) fetch(r *reader, keys []string, revs []mvcc.Revision) ([]etcdscan.KV, error) {
	out := make([]etcdscan.KV, len(keys))
	rb := mvcc.NewRevBytes()
	for i := range keys {
		if r.read >= mappedBytes {
			if err := r.release(); err != nil {
				return nil, err
			}
		}
		rb = mvcc.RevToBytes(revs[i], rb)
		v := r.tx.Bucket(schema.Key.Name()).Get(rb)
		if v == nil {
			return nil, FileError(f.Info.Path, "changed while it was being read: no record at revision %d_%d of %s", revs[i].Main, revs[i].Sub, keys[i])
		}
		// A record read out of order maps its own pages and, the kernel's
		// fault-around, up to 64 KiB of the file around them.
		r.account(faultAround + len(v))
		var kv mvccpb.KeyValue
		if err := proto.Unmarshal(v, &kv); err != nil {
			return nil, FileError(f.Info.Path, "damaged key record %x: %v", rb, err)
		}
		if string(kv.Key) != keys[i] {
			return nil, FileError(f.Info.Path, "changed while it was being read: the record at revision %d_%d is not %s", revs[i].Main, revs[i].Sub, keys[i])
		}
		out[i] = etcdscan.KV{Key: keys[i], Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}
	}
	return out, nil
}

// at resolves a requested revision (0: the file's) as etcd does: below the
// compaction is mvcc.ErrCompacted, above the current mvcc.ErrFutureRev.
func (f *File) at(rev int64) (int64, error) {
	if rev <= 0 {
		return f.Info.Revision, nil
	}
	if rev > f.Info.Revision {
		return 0, f.errorf("revision %d: %w (the file is at revision %d)", rev, mvcc.ErrFutureRev, f.Info.Revision)
	}
	if rev < f.Info.CompactRevision {
		return 0, f.errorf("revision %d: %w (the oldest revision the file has is %d)", rev, mvcc.ErrCompacted, f.Info.CompactRevision)
	}
	return rev, nil
}

// rangeOf is the range of keys under prefix: [lo, end), "" end for none.
func rangeOf(prefix string) (lo, end string) {
	end = etcdscan.PrefixEnd(prefix)
	if end == "\x00" {
		end = ""
	}
	return prefix, end
}

type page struct {
	kvs []etcdscan.KV
	err error
}

// Scan reads every key under opts.Prefixes at opts.Revision (0: the file's),
// in key order, in pages of opts.PageSize, calling fn once per page; the
// next page is read while fn runs. The scan is always consistent: a file does
// not move. CommandTimeout, Retries and KeepRevision have no use here.
func (f *File) Scan(ctx context.Context, opts etcdscan.ScanOptions, fn func(page []etcdscan.KV) error) (etcdscan.ScanStats, error) {
	if len(opts.Prefixes) == 0 {
		return etcdscan.ScanStats{}, fmt.Errorf("scan: no prefix given")
	}
	if opts.PageSize <= 0 {
		opts.PageSize = etcdscan.DefaultPageSize
	}
	rev, err := f.at(opts.Revision)
	if err != nil {
		return etcdscan.ScanStats{}, err
	}
	stats := etcdscan.ScanStats{Revision: rev, Consistent: true}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pages := make(chan page) // unbuffered: the producer holds at most one page ahead
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(pages)
		err := f.view(func(r *reader) error {
			for _, prefix := range opts.Prefixes {
				lo, end := rangeOf(prefix)
				for {
					w, err := f.window(pctx, r, rev, lo, end)
					if err != nil {
						return err
					}
					lo = w.hi
					for i := 0; i < len(w.keys); i += int(opts.PageSize) {
						j := min(i+int(opts.PageSize), len(w.keys))
						kvs, err := f.fetch(r, w.keys[i:j], w.revs[i:j])
						if err != nil {
							return err
						}
						select {
						case pages <- page{kvs: kvs}:
						case <-pctx.Done():
							return pctx.Err()
						}
					}
					if lo == "" {
						break
					}
				}
			}
			return nil
		})
		if err != nil && pctx.Err() == nil {
			select {
			case pages <- page{err: err}:
			case <-pctx.Done():
			}
		}
	}()
	var scanErr error
	for pg := range pages {
		if pg.err != nil {
			scanErr = pg.err
			break
		}
		if ctx.Err() != nil {
			break
		}
		stats.Pages++
		for _, kv := range pg.kvs {
			stats.Keys++
			stats.Bytes += int64(len(kv.Key) + len(kv.Value))
		}
		if err := fn(pg.kvs); err != nil {
			scanErr = err
			break
		}
	}
	cancel()
	for range pages { // let the producer finish
	}
	wg.Wait()
	if scanErr == nil && ctx.Err() != nil {
		scanErr = ctx.Err()
	}
	return stats, scanErr
}

// Get reads one key at rev (0: the file's revision): one pass over the file.
func (f *File) Get(ctx context.Context, key string, rev int64) (etcdscan.KV, bool, error) {
	rev, err := f.at(rev)
	if err != nil {
		return etcdscan.KV{}, false, err
	}
	var kv etcdscan.KV
	var found bool
	err = f.view(func(r *reader) error {
		w, err := f.window(ctx, r, rev, key, key+"\x00")
		if err != nil || len(w.keys) == 0 {
			return err
		}
		kvs, err := f.fetch(r, w.keys[:1], w.revs[:1])
		if err != nil {
			return err
		}
		kv, found = kvs[0], true
		return nil
	})
	return kv, found, err
}

// Count counts the keys under prefix at the file's revision: one pass over
// the file, the first window's, which a Scan of the prefix that follows
// (inventory's progress bar, then its scan) takes from the cache; a pass per
// window of keys when a compaction was left unfinished (see pass).
func (f *File) Count(ctx context.Context, prefix string) (int64, error) {
	var n int64
	err := f.view(func(r *reader) error {
		lo, end := rangeOf(prefix)
		for first := true; ; first = false {
			w, err := f.window(ctx, r, f.Info.Revision, lo, end)
			if err != nil {
				return err
			}
			if first && w.total >= 0 {
				n = w.total
				return nil
			}
			n += int64(len(w.keys))
			if w.hi == "" {
				return nil
			}
			lo = w.hi
		}
	})
	return n, err
}

// Revisions are the file's revision and its compaction revision.
func (f *File) Revisions(context.Context) (int64, int64, error) {
	return f.Info.Revision, f.Info.CompactRevision, nil
}

// Lease reads the lease from the file's lease bucket: its granted TTL, and as
// time left the same (etcd gives a restored lease its full TTL); TTL -1 when
// there is no such lease, as etcd answers.
func (f *File) Lease(_ context.Context, id int64) (etcdscan.Lease, error) {
	out := etcdscan.Lease{ID: id, TTL: -1}
	err := f.view(func(r *reader) error {
		if l := schema.MustUnsafeGetLease(unsafeReader{r.tx}, id); l != nil {
			out.GrantedTTL, out.TTL = l.TTL, l.TTL
		}
		return nil
	})
	return out, err
}
