package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
)

// The ceiling: what etcd itself does on the same keys with the same page size,
// batch size and concurrency as the tool, with no decoding, decryption or encoding.

type rawKV struct {
	key, value []byte
	modRev     int64
}

type ceilingResult struct {
	keys, bytes, rewrites, failed int64
	elapsed                       time.Duration
}

// rawScan reads every key under prefix at one revision in pages of pageSize,
// one page ahead of the consumer, with the tool's own scanner (etcdscan.Scan:
// etcd 3.7's RangeStream, else the look-ahead walk), so both pay etcd the
// same for reading; fn sees each page's keys, values and mod revisions.
func rawScan(ctx context.Context, cli *clientv3.Client, prefix string, pageSize int64, fn func([]rawKV) error) (keys, bytes int64, err error) {
	_, err = etcdscan.Scan(ctx, cli, etcdscan.ScanOptions{Prefixes: []string{prefix}, PageSize: pageSize}, func(page []etcdscan.KV) error {
		kvs := make([]rawKV, len(page))
		for i, kv := range page {
			kvs[i] = rawKV{key: []byte(kv.Key), value: kv.Value, modRev: kv.ModRevision}
			keys++
			bytes += int64(len(kv.Value))
		}
		if fn == nil {
			return nil
		}
		return fn(kvs)
	})
	if err != nil {
		return keys, bytes, fmt.Errorf("range %s: %w", prefix, err)
	}
	return keys, bytes, nil
}

// scanCeiling only range-reads the keyspace (the verify ceiling).
func scanCeiling(ctx context.Context, cli *clientv3.Client, pageSize int64) (ceilingResult, error) {
	start := time.Now()
	k, b, err := rawScan(ctx, cli, "/registry/", pageSize, nil)
	return ceilingResult{keys: k, bytes: b, elapsed: time.Since(start)}, err
}

// casCeiling scans like the tool and CAS-rewrites the same bytes of the keys the
// tool rewrites (txn If ModRevision==x Then Put(same value, IgnoreLease)), in
// transactions of batchOps puts / batchBytes with `writers` concurrent writers
// fed through a bounded queue, as migrate does.
func casCeiling(ctx context.Context, cli *clientv3.Client, pageSize int64, stale map[string]bool, batchOps, batchBytes, writers int) (ceilingResult, error) {
	return casCeilingWith(ctx, cli, pageSize, stale, batchOps, batchBytes, writers, nil, nil)
}

// casCeilingWith is casCeiling with before, when set, called before each
// transaction (an error fails it), and written after each that succeeded,
// with its batch and the revision it made.
func casCeilingWith(ctx context.Context, cli *clientv3.Client, pageSize int64, stale map[string]bool, batchOps, batchBytes, writers int,
	before func([]rawKV) error, written func([]rawKV, int64)) (ceilingResult, error) {
	start := time.Now()
	queue := make(chan []rawKV, writers)
	var rewrites, failed atomic.Int64
	var wg sync.WaitGroup
	var werr error
	var once sync.Once
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range queue {
				cmps := make([]clientv3.Cmp, len(b))
				ops := make([]clientv3.Op, len(b))
				for i, kv := range b {
					k := string(kv.key)
					cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", kv.modRev)
					ops[i] = clientv3.OpPut(k, string(kv.value), clientv3.WithIgnoreLease())
				}
				var resp *clientv3.TxnResponse
				err := error(nil)
				if before != nil {
					err = before(b)
				}
				if err == nil {
					resp, err = cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
				}
				if err != nil {
					once.Do(func() { werr = err })
					failed.Add(int64(len(b)))
					continue
				}
				if !resp.Succeeded {
					failed.Add(int64(len(b)))
					continue
				}
				rewrites.Add(int64(len(b)))
				if written != nil {
					written(b, resp.Header.Revision)
				}
			}
		}()
	}
	k, by, err := rawScan(ctx, cli, "/registry/", pageSize, func(page []rawKV) error {
		var batch []rawKV
		size := 0
		for _, kv := range page {
			if !stale[string(kv.key)] {
				continue
			}
			sz := 2*len(kv.key) + len(kv.value) + 64
			if len(batch) > 0 && (len(batch) == batchOps || size+sz > batchBytes) {
				queue <- batch
				batch, size = nil, 0
			}
			batch = append(batch, kv)
			size += sz
		}
		if len(batch) > 0 {
			queue <- batch
		}
		return nil
	})
	close(queue)
	wg.Wait()
	res := ceilingResult{keys: k, bytes: by, rewrites: rewrites.Load(), failed: failed.Load(), elapsed: time.Since(start)}
	if err == nil {
		err = werr
	}
	return res, err
}

// compactingCeiling is the compaction-matched ceiling of a rewrite that does
// not fit below etcd's quota: casCeiling at the tool's flags, each batch
// going through the tool's own space guard (guard.NewSpaceGuard, compacting):
// the same compactions at the same points, in the background, a batch
// waiting for the room they free only when it would grow etcd's database
// into the margin, and the last compaction waited for at the end (Finish)
// until etcd has taken it, as a run does. It has no liveness watch, no journal, no snapshot, no
// decoding: the bound the tool's migrate --compact-history is compared
// with. It returns the guard's report: the compactions made, and how long
// the writes waited in the guard.
func compactingCeiling(ctx context.Context, cli *clientv3.Client, stale map[string]bool, quota int64) (ceilingResult, *guard.SpaceReport, error) {
	sg, err := guard.NewSpaceGuard(ctx, cli, quota, true)
	if err != nil {
		return ceilingResult{}, nil, err
	}
	cost := func(b []rawKV) (c int64) {
		for _, kv := range b {
			c += guard.PutCost(string(kv.key), kv.value)
		}
		return c
	}
	before := func(b []rawKV) error { return sg.Reserve(ctx, cost(b)) }
	written := func(b []rawKV, _ int64) { sg.Done(cost(b)) }
	c, err := casCeilingWith(ctx, cli, etcdscan.DefaultPageSize, stale, etcdscan.DefaultMaxOps, etcdscan.DefaultMaxBytes, toolWriters, before, written)
	end := time.Now()
	sg.Finish(ctx)
	c.elapsed += time.Since(end)
	return c, sg.Report(), err
}

// sweepPoint is one run of the CAS ceiling at one setting.
type sweepPoint struct {
	Ops           int     `json:"batchOps"`
	Writers       int     `json:"writers"`
	ObjectsPerS   float64 `json:"objectsPerSecond"`
	EtcdRSSAfterM float64 `json:"etcdRSSAfterMB"`
}

// The settings the sweep tries (the issue: 16-128 puts per transaction, 4-32 in flight).
var (
	sweepOps     = []int{16, 32, 64, 128}
	sweepWriters = []int{4, 8, 16, 32}
)

// casSweep runs the CAS ceiling once at every setting and keeps the fastest as
// the ceiling's own best settings (res.CeilingOps, res.CeilingWriters).
func casSweep(ctx context.Context, res *results, etcd *etcdProc, stale map[string]bool, settle func() error) error {
	best := 0.0
	for _, ops := range sweepOps {
		for _, writers := range sweepWriters {
			if err := settle(); err != nil {
				return err
			}
			c, err := casCeiling(ctx, etcd.cli, etcdscan.DefaultPageSize, stale, ops, etcdscan.DefaultMaxBytes, writers)
			if err != nil {
				return fmt.Errorf("CAS ceiling sweep (%d puts/txn, %d in flight): %w", ops, writers, err)
			}
			if c.rewrites != int64(len(stale)) {
				return fmt.Errorf("CAS ceiling sweep rewrote %d keys, want %d (%d failed)", c.rewrites, len(stale), c.failed)
			}
			p := sweepPoint{Ops: ops, Writers: writers, ObjectsPerS: float64(c.keys) / c.elapsed.Seconds(), EtcdRSSAfterM: float64(etcd.RSSKB()) / 1024}
			res.CASSweep = append(res.CASSweep, p)
			logf("  sweep: CAS ceiling %3d puts/txn, %2d in flight: %.0f objects/s, etcd RSS %.0f MB", ops, writers, p.ObjectsPerS, p.EtcdRSSAfterM)
			if p.ObjectsPerS > best {
				best, res.CeilingOps, res.CeilingWriters = p.ObjectsPerS, ops, writers
			}
		}
	}
	logf("  sweep: best %d puts/txn, %d in flight (%.0f objects/s)", res.CeilingOps, res.CeilingWriters, best)
	return nil
}
