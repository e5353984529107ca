package snapshotdb

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"kube-etcd-migrate/etcdscan"
)

var _ etcdscan.Source = (*File)(nil)

// cachedIndexes is how many indexes a File keeps, the most recently used: a
// command reads at one revision, and may look up a key or two at the file's
// own (the release in kubeadm-config) while it does.
const cachedIndexes = 2

// index returns the index of the keys at rev, from the cache or built with
// a pass over the file (one build at a time: a read at the same revision
// waits for it rather than making its own); the caller releases it.
func (f *File) index(ctx context.Context, r *reader, rev int64) (*index, error) {
	f.building.Lock()
	defer f.building.Unlock()
	f.mu.Lock()
	for i, x := range f.cache {
		if x.rev == rev {
			x.refs.Add(1)
			// The most recently used first.
			copy(f.cache[1:i+1], f.cache[:i])
			f.cache[0] = x
			f.mu.Unlock()
			return x, nil
		}
	}
	f.mu.Unlock()
	x, err := f.build(ctx, r, rev)
	if err != nil {
		return nil, err
	}
	x.refs.Store(2) // the cache's and the caller's
	f.mu.Lock()
	f.cache = append([]*index{x}, f.cache...)
	var old []*index
	if len(f.cache) > cachedIndexes {
		old, f.cache = f.cache[cachedIndexes:], f.cache[:cachedIndexes:cachedIndexes]
	}
	f.mu.Unlock()
	for _, x := range old {
		x.release()
	}
	return x, nil
}

// local is ctx for a read of the file: it keeps ctx's cancellation (an
// interrupted command stops reading) but not its deadline. A deadline bounds
// a request to a live etcd, whose member may not answer; a file always
// answers, and the first read at a revision builds the key index in a pass
// over the whole file, which for a backup of etcd's largest quota on a slow
// disk takes longer than any request's timeout (the callers' are etcd's).
func local(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); !ok {
		return ctx, func() {}
	}
	lctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel(context.Cause(ctx))
		}
	})
	return lctx, func() { stop(); cancel(nil) }
}

// The number of mvccpb.KeyValue's key field, from its own descriptor.
var keyField = (&mvccpb.KeyValue{}).ProtoReflect().Descriptor().Fields().ByName("key").Number()

// recordKey returns the key of a record of etcd's key bucket (an encoded
// mvccpb.KeyValue) without decoding the rest: a pass looks at the key of every
// record, and copying every value (what proto.Unmarshal does) would be most of
// its cost. The fields are walked with protobuf's own wire reader up to the
// key (which etcd writes first).
func recordKey(v []byte) ([]byte, error) {
	for len(v) > 0 {
		num, typ, n := protowire.ConsumeTag(v)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		v = v[n:]
		if num == keyField && typ == protowire.BytesType {
			b, n := protowire.ConsumeBytes(v)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			return b, nil
		}
		n = protowire.ConsumeFieldValue(num, typ, v)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		v = v[n:]
	}
	return nil, fmt.Errorf("no key in the record")
}

// fetch reads the records of keys[i] at revs[i].
func (f *File) fetch(r *reader, keys []string, revs []mvcc.Revision) ([]etcdscan.KV, error) {
	out := make([]etcdscan.KV, len(keys))
	rb := mvcc.NewRevBytes()
	for i := range keys {
		rb = mvcc.RevToBytes(revs[i], rb)
		v := r.bucket().Get(rb)
		if v == nil {
			return nil, changedOrDamaged(f.Info.Path, f.opened, "no record at revision %d_%d of %s, which a pass over its records found", revs[i].Main, revs[i].Sub, keys[i])
		}
		var kv mvccpb.KeyValue
		if err := proto.Unmarshal(v, &kv); err != nil {
			return nil, damaged(f.Info.Path, "key record %x: %v", rb, err)
		}
		if string(kv.Key) != keys[i] {
			return nil, changedOrDamaged(f.Info.Path, f.opened, "the record at revision %d_%d is not %s, as a pass over its records found", revs[i].Main, revs[i].Sub, keys[i])
		}
		out[i] = etcdscan.KV{Key: keys[i], Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease, ModSub: revs[i].Sub}
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

// Scan reads every key under opts.Prefixes at opts.Revision (0: the file's),
// in key order, in pages of opts.PageSize, calling fn once per page; the
// next page is read while fn runs. The scan is always consistent: a file does
// not move. CommandTimeout, Retries and KeepRevision have no use here.
func (f *File) Scan(ctx context.Context, opts etcdscan.ScanOptions, fn func(page []etcdscan.KV) error) (etcdscan.ScanStats, error) {
	ctx, done := local(ctx)
	defer done()
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
	err = etcdscan.Paged(ctx, &stats, func(pctx context.Context, send func([]etcdscan.KV) error) error {
		return f.view(func(r *reader) error {
			x, err := f.index(pctx, r, rev)
			if err != nil {
				return err
			}
			defer x.release()
			size := int(opts.PageSize)
			keys, revs := make([]string, 0, size), make([]mvcc.Revision, 0, size)
			flush := func() error {
				kvs, err := f.fetch(r, keys, revs)
				if err != nil {
					return err
				}
				keys, revs = keys[:0], revs[:0]
				return send(kvs)
			}
			for _, prefix := range opts.Prefixes {
				lo, end := rangeOf(prefix)
				err := x.each(pctx, lo, end, func(key []byte, rev mvcc.Revision) error {
					keys, revs = append(keys, string(key)), append(revs, rev)
					if len(keys) == size {
						return flush()
					}
					return nil
				})
				if err == nil && len(keys) > 0 {
					err = flush()
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
	}, fn)
	return stats, err
}

// Get reads one key at rev (0: the file's revision), from the index of the
// keys at rev: one pass over the file, unless a read at rev made it already.
func (f *File) Get(ctx context.Context, key string, rev int64) (etcdscan.KV, bool, error) {
	ctx, done := local(ctx)
	defer done()
	rev, err := f.at(rev)
	if err != nil {
		return etcdscan.KV{}, false, err
	}
	var kv etcdscan.KV
	var found bool
	err = f.view(func(r *reader) error {
		x, err := f.index(ctx, r, rev)
		if err != nil {
			return err
		}
		defer x.release()
		var at mvcc.Revision
		err = x.each(ctx, key, key+"\x00", func(_ []byte, rev mvcc.Revision) error {
			at, found = rev, true
			return nil
		})
		if err != nil || !found {
			return err
		}
		kvs, err := f.fetch(r, []string{key}, []mvcc.Revision{at})
		if err != nil {
			return err
		}
		kv = kvs[0]
		return nil
	})
	return kv, found, err
}

// Count counts the keys under prefix at the file's revision, from the index
// of the keys at that revision: one pass over the file, which a Scan of the
// prefix that follows (inventory's progress bar, then its scan) shares.
func (f *File) Count(ctx context.Context, prefix string) (int64, error) {
	ctx, done := local(ctx)
	defer done()
	var n int64
	err := f.view(func(r *reader) error {
		x, err := f.index(ctx, r, f.Info.Revision)
		if err != nil {
			return err
		}
		defer x.release()
		lo, end := rangeOf(prefix)
		n, err = x.count(ctx, lo, end)
		return err
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

// EachRevision calls fn with the revision (main, sub) of every key at the
// file's revision, in key order, from the index a Scan at that revision
// shares: what an output snapshot's writer needs to know which records of
// the key bucket are live.
func (f *File) EachRevision(ctx context.Context, fn func(main, sub int64) error) error {
	ctx, done := local(ctx)
	defer done()
	return f.view(func(r *reader) error {
		x, err := f.index(ctx, r, f.Info.Revision)
		if err != nil {
			return err
		}
		defer x.release()
		return x.each(ctx, "", "", func(_ []byte, rev mvcc.Revision) error {
			return fn(rev.Main, rev.Sub)
		})
	})
}
