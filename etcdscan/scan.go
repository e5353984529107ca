package etcdscan

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/crash"
)

// Scan defaults.
const (
	DefaultPageSize           = 500
	DefaultScanCommandTimeout = 30 * time.Second
	// DefaultMaxChunkBytes is the largest chunk of etcd 3.7's RangeStream
	// the scan takes: etcd aims its chunks at its --max-request-bytes (1.5
	// MiB by default) and halves a chunk's key limit only after a chunk of
	// twice that, so chunks stay under about 3 MiB where keys are alike in
	// size; small keys followed by large ones make one chunk of thousands
	// of large values (see stream), which this refuses before reading it.
	DefaultMaxChunkBytes = 8 << 20
)

// ScanOptions select what Scan reads.
type ScanOptions struct {
	// Prefixes are walked in this order; "" means the whole keyspace.
	// Overlapping prefixes yield their common keys twice.
	Prefixes []string
	// Revision pins the scan; 0 pins the revision of the first page.
	Revision int64
	// KeepRevision makes a compaction of Revision an error instead of going on
	// at the current revision (a revision the caller asked for explicitly).
	KeepRevision bool
	// PageSize is the number of keys per request (default 500).
	PageSize int64
	// CommandTimeout bounds one page request (default 30s).
	CommandTimeout time.Duration
	// Retries bounds the retries of one page on transient errors (default DefaultRetries; <0 none).
	Retries int
	// MaxChunkBytes is the largest chunk of a RangeStream the scan takes
	// (default DefaultMaxChunkBytes); after a larger one it pages the next
	// keys (see stream).
	MaxChunkBytes int
}

// Restart records that the pinned revision was compacted during the scan and
// the scan went on from the key after AfterKey at the newer Revision.
type Restart struct {
	AfterKey string
	Revision int64
}

// ScanStats describe a finished (or failed) scan.
type ScanStats struct {
	// Revision is the first pinned revision.
	Revision int64
	// Consistent is true when every key was read at Revision (no Restarts).
	Consistent bool
	Restarts   []Restart
	Keys       int64
	Bytes      int64 // keys + values
	Pages      int
	// Streams is the number of RangeStream requests made (etcd 3.7), and
	// LargeChunks how many of them ended at a chunk above MaxChunkBytes.
	Streams, LargeChunks int
}

// PrefixEnd returns the range end that covers every key starting with prefix
// ("\x00", i.e. no end, for "" or an all-0xff prefix).
func PrefixEnd(prefix string) string {
	return clientv3.GetPrefixRangeEnd(prefix)
}

type scanPage struct {
	kvs []KV
	err error
}

// Paged is the consumer loop of every scan (of etcd here, of a snapshot file
// in snapshotdb): it runs produce in a goroutine, which reads pages in key
// order and hands each to send (an error from send: stop, the consumer is
// gone), and calls fn on each page while the next is read, so at most two
// pages are held. It counts pages, keys and bytes into stats. The first error
// of produce or fn, or ctx's end, stops both; Paged returns once produce has
// returned. A panic of produce is its error, a *crash.Panic, returned
// whatever else ended the scan.
func Paged(ctx context.Context, stats *ScanStats, produce func(ctx context.Context, send func([]KV) error) error, fn func(page []KV) error) error {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pages := make(chan scanPage) // unbuffered: the producer holds at most one page ahead
	var wg sync.WaitGroup
	var crashed *crash.Panic
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(pages)
		send := func(kvs []KV) error {
			select {
			case pages <- scanPage{kvs: kvs}:
				return nil
			case <-pctx.Done():
				return pctx.Err()
			}
		}
		err := func() (err error) {
			defer crash.Recover("scanning", &err)
			crash.At("scan")
			return produce(pctx, send)
		}()
		if p, ok := err.(*crash.Panic); ok {
			crashed = p
			return
		}
		if err != nil && pctx.Err() == nil {
			select {
			case pages <- scanPage{err: err}:
			case <-pctx.Done():
			}
		}
	}()
	var err error
	for pg := range pages {
		if pg.err != nil {
			err = pg.err
			break
		}
		if ctx.Err() != nil {
			break // reported below
		}
		stats.Pages++
		for _, kv := range pg.kvs {
			stats.Keys++
			stats.Bytes += int64(len(kv.Key) + len(kv.Value))
		}
		if ferr := fn(pg.kvs); ferr != nil {
			err = ferr
			break
		}
	}
	cancel()
	for range pages { // let the producer finish
	}
	wg.Wait()
	if crashed != nil {
		return crashed
	}
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return err
}

// Scan reads every key under opts.Prefixes, in key order, at one pinned
// revision, calling fn once per page. The next page is fetched while fn runs,
// so at most two pages are held whatever the size of the keyspace; fn must not
// keep the slice (it may keep the values). When the pinned revision is
// compacted mid-scan (rpctypes.ErrCompacted) the scan goes on from the key
// after the last one read, at the then current revision, and records a Restart:
// each key is still seen at most once per prefix, but not all at one revision.
// Transient errors are retried with backoff; an error of fn stops the scan and
// is returned as is.
func Scan(ctx context.Context, cli *clientv3.Client, opts ScanOptions, fn func(page []KV) error) (ScanStats, error) {
	if len(opts.Prefixes) == 0 {
		return ScanStats{}, errors.New("scan: no prefix given")
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.CommandTimeout <= 0 {
		opts.CommandTimeout = DefaultScanCommandTimeout
	}
	if opts.Retries == 0 {
		opts.Retries = DefaultRetries
	} else if opts.Retries < 0 {
		opts.Retries = 0
	}

	if opts.MaxChunkBytes <= 0 {
		opts.MaxChunkBytes = DefaultMaxChunkBytes
	}

	p := &producer{cli: cli, opts: opts, rev: opts.Revision}
	p.streamKV = clientv3.NewKVFromKVClient(chunkCap{clientv3.RetryKVClient(cli), opts.MaxChunkBytes}, cli)
	var stats ScanStats
	err := Paged(ctx, &stats, p.run, fn)
	stats.Revision = p.firstRev
	stats.Restarts = p.restarts
	stats.Consistent = len(p.restarts) == 0
	stats.Streams, stats.LargeChunks = p.streams, p.largeChunks
	return stats, err
}

type producer struct {
	cli      *clientv3.Client
	streamKV clientv3.KV // cli's, its streams' chunks capped (chunkCap)
	opts     ScanOptions
	rev      int64 // current pinned revision (0: not yet pinned)
	firstRev int64
	lastKey  string
	restarts []Restart
	noStream bool // etcd answered RangeStream with Unimplemented: walk instead
	// streams and largeChunks are ScanStats'.
	streams, largeChunks int
}

func (p *producer) run(ctx context.Context, send func([]KV) error) error {
	for _, prefix := range p.opts.Prefixes {
		if err := p.prefix(ctx, prefix, send); err != nil {
			return err
		}
	}
	return nil
}

// prefix reads every key under prefix: as one stream where etcd serves
// RangeStream, paging (RangeWalk) where it does not, and, after a chunk
// above MaxChunkBytes, paging the next lookAheadKeys keys before a new
// stream (which starts again with small chunks).
func (p *producer) prefix(ctx context.Context, prefix string, send func([]KV) error) error {
	key := NewRangeWalk(prefix, p.opts.PageSize).key
	for {
		var budget int64 // the keys to page before streaming again (0: the rest)
		if !p.noStream {
			from, err := p.stream(ctx, key, PrefixEnd(prefix), send)
			switch {
			case err == nil:
				return nil
			case errors.Is(err, errNoStream):
				// etcd before 3.7: the walk reads the rest, from where the
				// stream stopped (nothing was read from it in practice).
				p.noStream = true
			case errors.Is(err, errChunkTooLarge):
				p.largeChunks++
				budget = lookAheadKeys
			default:
				return err
			}
			key = from
		}
		next, more, err := p.walk(ctx, prefix, key, budget, send)
		if err != nil || !more {
			return err
		}
		key = next
	}
}

// walk pages through prefix from key on, to its end or, with a budget, to
// the end of the first page that makes budget keys; it returns the key to go
// on from and whether the prefix has more.
func (p *producer) walk(ctx context.Context, prefix, from string, budget int64, send func([]KV) error) (string, bool, error) {
	walk := NewRangeWalk(prefix, p.opts.PageSize)
	walk.key = from
	var read int64
	for {
		key, end, limit, keysOnly := walk.Range()
		if keysOnly {
			keys, more, err := p.keys(ctx, key, end, limit)
			if err != nil {
				return "", false, err
			}
			walk.Ahead(keys, more)
			continue
		}
		kvs, more, count, err := p.page(ctx, key, end)
		if err != nil {
			return "", false, err
		}
		if len(kvs) > 0 {
			p.lastKey = kvs[len(kvs)-1].Key
			if err := send(kvs); err != nil {
				return "", false, err
			}
		}
		read += int64(len(kvs))
		if !walk.Next(p.lastKey, len(kvs), more, count) {
			return "", false, nil
		}
		if budget > 0 && read >= budget {
			return walk.key, true, nil
		}
	}
}

// RangeWalk turns one prefix into the sequence of limited range requests that
// read it in key order, each counting few keys beyond what it returns: the
// scan's way where etcd has no RangeStream (before 3.7; see stream). etcd
// (3.5 to 3.7) answers a range request with a limit by visiting every key of
// the whole range [key, end) to count them, so paging through a range of n
// keys costs O(n²/page) of etcd's CPU (at 4,000,000 objects, half of etcd's
// CPU during a migrate went to counting), and so does going back to a wide
// range after each small key directory. Where many pages remain, the walk
// looks ahead: one keys-only request returns the next lookAheadKeys keys,
// and every page-size-th of them ends a window of one page, so each page
// counts only its own keys. When all the keys a look ahead returned lie in
// one key directory, the walk narrows to each directory they share, the
// resource, then the namespace ("/registry/events/", then
// "/registry/events/default/"), so the next look ahead counts only what is
// left of the namespace, and after it only what is left of the resource.
// Use Range for the next request, and Next (a page) or Ahead (a look ahead)
// to record its answer.
type RangeWalk struct {
	prefix   string
	pageSize int64
	key      string
	windows  []window // a stack, the widest (the prefix's) first
	ahead    bool     // the next request is a look ahead
}

// window is a range end of the walk's stack; paged: it holds about a page
// (a look ahead's), so going back to it reads a page, not a look ahead.
type window struct {
	end   string
	paged bool
}

// Walk tuning: how many keys one look ahead asks for (about 2 MB of keys in
// one answer, whatever the page size: a small --page-size for large
// values does not make the look aheads, and their counts, more), and how
// many pages must remain in a window before the walk looks ahead.
const (
	lookAheadKeys    = 32768
	narrowAfterPages = 4
)

// NewRangeWalk starts a walk of every key under prefix ("" for all keys).
func NewRangeWalk(prefix string, pageSize int64) *RangeWalk {
	key := prefix
	if prefix == "" {
		key = "\x00"
	}
	return &RangeWalk{prefix: prefix, pageSize: pageSize, key: key, windows: []window{{end: PrefixEnd(prefix)}}}
}

func (w *RangeWalk) end() string { return w.windows[len(w.windows)-1].end }

// Range is the next request: [key, end), limited to limit keys. With
// keysOnly it is a look ahead: read the keys only (at the walk's revision)
// and pass them to Ahead; otherwise a page, whose answer goes to Next.
func (w *RangeWalk) Range() (key, end string, limit int64, keysOnly bool) {
	if w.ahead {
		return w.key, w.end(), max(lookAheadKeys, 2*narrowAfterPages*w.pageSize), true
	}
	return w.key, w.end(), w.pageSize, false
}

// Next records etcd's answer to a page: the last key returned (ignored when
// n is 0), the number of keys returned, and the response's More and Count.
// It reports whether the prefix has more to read.
func (w *RangeWalk) Next(lastKey string, n int, more bool, count int64) bool {
	if n > 0 {
		w.key = lastKey + "\x00"
	}
	if !more || n == 0 {
		// The window is read; go on after it, in the enclosing one.
		if len(w.windows) == 1 {
			return false
		}
		w.key = w.end()
		w.windows = w.windows[:len(w.windows)-1]
		w.ahead = !w.windows[len(w.windows)-1].paged
		return true
	}
	w.ahead = count-int64(n) > narrowAfterPages*w.pageSize
	return true
}

// Ahead records etcd's answer to a look ahead: the keys from the walk's key
// on, in order, and the response's More. The walk then reads them a page at
// a time, each request ending at the first key of the next page, and after
// the last goes on in the window it was in (or in the innermost key
// directory all of them share). Keys written since (the walk read at a newer revision after
// a compaction) only make a page longer: it is paged through as any other.
func (w *RangeWalk) Ahead(keys []*mvccpb.KeyValue, more bool) {
	w.ahead = false
	if len(keys) == 0 {
		return // the page that follows finds the window read
	}
	if more {
		last := string(keys[len(keys)-1].Key)
		for _, dir := range keyDirs(w.prefix, string(keys[0].Key), last, w.end()) {
			w.windows = append(w.windows, window{end: dir})
		}
		w.windows = append(w.windows, window{end: last + "\x00", paged: true})
	}
	page := int(w.pageSize)
	for i := (len(keys) - 1) / page * page; i > 0; i -= page {
		w.windows = append(w.windows, window{end: string(keys[i].Key), paged: true})
	}
}

// keyDirs returns the ends of the key directories below prefix that hold
// both first and last and are narrower than end, the widest first (the
// resource, then the namespace), or none when the keys lie in different
// directories of the window. After the namespace the walk goes back to the
// resource, whose rest is what the next look ahead counts, not the prefix's.
func keyDirs(prefix, first, last, end string) []string {
	n := len(prefix)
	for n < len(first) && n < len(last) && first[n] == last[n] {
		n++
	}
	var ends []string
	for i := len(prefix); i < n; i++ {
		if first[i] != '/' {
			continue
		}
		e := PrefixEnd(first[:i+1])
		if e != "\x00" && (end == "\x00" || e < end) {
			ends = append(ends, e)
			end = e
		}
	}
	return ends
}

// page reads one page from key, pinning the revision on the first call and
// moving to the current revision when the pinned one is compacted.
func (p *producer) page(ctx context.Context, key, end string) ([]KV, bool, int64, error) {
	resp, err := p.get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(p.opts.PageSize))
	if err != nil {
		return nil, false, 0, err
	}
	return toKVs(resp.Kvs), resp.More, resp.Count, nil
}

// keys is a walk's look ahead (RangeWalk.Ahead): the keys only of
// [key, end), at most limit, at the pinned revision as page reads them.
func (p *producer) keys(ctx context.Context, key, end string, limit int64) ([]*mvccpb.KeyValue, bool, error) {
	resp, err := p.get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(limit), clientv3.WithKeysOnly())
	if err != nil {
		return nil, false, err
	}
	return resp.Kvs, resp.More, nil
}

// compacted reports whether err is the compaction of the pinned revision
// that the scan goes on from (not KeepRevision); if so it records a Restart
// after the last key read and unpins the revision: the next request reads at
// the current one and pins that.
func (p *producer) compacted(err error) bool {
	if !errors.Is(err, rpctypes.ErrCompacted) || p.rev == 0 || p.opts.KeepRevision {
		return false
	}
	if p.firstRev == 0 {
		p.firstRev = p.rev
	}
	p.rev = 0
	p.restarts = append(p.restarts, Restart{AfterKey: p.lastKey})
	return true
}

// get is one range request of the scan at its pinned revision, pinning it
// on the first call and moving to the current revision when the pinned one
// is compacted (a Restart); transient errors are retried.
func (p *producer) get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	for {
		ops := opts
		if p.rev > 0 {
			ops = append(slices.Clip(opts), clientv3.WithRev(p.rev))
		}
		var resp *clientv3.GetResponse
		_, err := withRetry(ctx, p.opts.CommandTimeout, p.opts.Retries, func(c context.Context) error {
			var gerr error
			resp, gerr = p.cli.Get(c, key, ops...)
			return gerr
		})
		if p.compacted(err) {
			continue
		}
		if isTransient(ctx, err) {
			// Every retry met etcd unavailable.
			err = &UnavailableError{Endpoints: p.cli.Endpoints(), Attempts: p.opts.Retries + 1, Timeout: p.opts.CommandTimeout, Err: err}
		}
		if err != nil {
			if p.rev > 0 {
				return nil, fmt.Errorf("scan %q at revision %d: %w", key, p.rev, err)
			}
			return nil, fmt.Errorf("scan %q: %w", key, err)
		}
		if p.rev == 0 {
			p.rev = resp.Header.Revision
			if n := len(p.restarts); n > 0 && p.restarts[n-1].Revision == 0 {
				p.restarts[n-1].Revision = p.rev
			}
		}
		if p.firstRev == 0 {
			p.firstRev = p.rev
		}
		return resp, nil
	}
}
