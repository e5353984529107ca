package etcdscan

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Source is what the read path reads a keyspace from, at one revision: a live
// etcd through ClientSource, or a snapshot file read in place (package
// snapshotdb). Every method is safe for concurrent
// use. Revision 0 means the source's current revision.
type Source interface {
	// Scan is Scan on this source: every key under opts.Prefixes in key
	// order, in pages, at one revision.
	Scan(ctx context.Context, opts ScanOptions, fn func(page []KV) error) (ScanStats, error)
	// Get reads one key at rev; found is false when the key does not exist
	// there (never written, deleted, or its lease revoked).
	Get(ctx context.Context, key string, rev int64) (kv KV, found bool, err error)
	// Count counts the keys under prefix ("" for all) at the current revision.
	Count(ctx context.Context, prefix string) (int64, error)
	// Revisions are the current revision and the oldest one still readable
	// (the compaction revision; 0 when never compacted).
	Revisions(ctx context.Context) (current, compacted int64, err error)
	// Lease describes the lease id; a lease that does not exist has TTL -1
	// (etcd's answer).
	Lease(ctx context.Context, id int64) (Lease, error)
}

// Lease is an etcd lease as a key's reader sees it.
type Lease struct {
	ID int64
	// GrantedTTL is the TTL the lease was granted with, seconds.
	GrantedTTL int64
	// TTL is the time it has left, seconds; -1 when the lease does not
	// exist. A snapshot file does not record it: a lease read from one has
	// its full TTL, as etcd gives it when the file is restored.
	TTL int64
}

// ClientSource reads through an etcd client.
type ClientSource struct {
	Client *clientv3.Client
}

var _ Source = ClientSource{}

// Scan runs Scan with the client.
func (s ClientSource) Scan(ctx context.Context, opts ScanOptions, fn func(page []KV) error) (ScanStats, error) {
	return Scan(ctx, s.Client, opts, fn)
}

// Get reads key at rev.
func (s ClientSource) Get(ctx context.Context, key string, rev int64) (KV, bool, error) {
	var opts []clientv3.OpOption
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := s.Client.Get(ctx, key, opts...)
	if err != nil {
		return KV{}, false, err
	}
	if len(resp.Kvs) == 0 {
		return KV{}, false, nil
	}
	kv := resp.Kvs[0]
	return KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}, true, nil
}

// Count counts with a count-only range request.
func (s ClientSource) Count(ctx context.Context, prefix string) (int64, error) {
	key, end := prefix, PrefixEnd(prefix)
	if prefix == "" {
		key = "\x00"
	}
	resp, err := s.Client.Get(ctx, key, clientv3.WithRange(end), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// Revisions asks etcd for its revision and its compaction (CompactRevision).
func (s ClientSource) Revisions(ctx context.Context) (int64, int64, error) {
	resp, err := s.Client.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, fmt.Errorf("read the current revision: %w", err)
	}
	compacted, err := CompactRevision(ctx, s.Client)
	if err != nil {
		return 0, 0, err
	}
	return resp.Header.Revision, compacted, nil
}

// Lease asks etcd for the lease's TTLs.
func (s ClientSource) Lease(ctx context.Context, id int64) (Lease, error) {
	ttl, err := s.Client.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return Lease{}, err
	}
	return Lease{ID: id, GrantedTTL: ttl.GrantedTTL, TTL: ttl.TTL}, nil
}
