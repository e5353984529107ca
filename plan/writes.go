package plan

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/batches"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// SQLiteCopy says that the datastore plan reads is a private copy of a
// SQLite datastore served through kine (kinedb.Server.Private): this
// process's own, removed when the command ends, the node's file never
// served. Only then does plan write, to that copy, to time migrate's
// writes there (sampleWrites).
type SQLiteCopy struct {
	// Copied is how long the copy took: SQLite's VACUUM INTO of the node's
	// file, as a writing run's undo snapshot of it is taken.
	Copied time.Duration
	// Copy is the copy's path and Datastore names the node's datastore
	// (kinedb.Server.Name), for messages.
	Copy, Datastore string
}

// WriteSample is what plan timed of migrate's writes on a SQLite
// datastore: rewrites of stale keys written to its private copy of the
// datastore through kine, as migrate writes them (kine compare-and-swap
// transactions, one key each, in migrate's batches and writers in flight),
// each of the size migrate would write (zeros: the copy is discarded). The
// node's datastore is not written.
type WriteSample struct {
	Writes  int `json:"writes"`
	Batches int `json:"batches"`
	Writers int `json:"writers"` // in flight, as migrate's
	// Bytes is what the sample's rewrites weigh, counted as the rewrite's
	// are (guard.WriteSizes' EtcdBytes: key and value, by the page).
	Bytes int64 `json:"bytes"`
	// Seconds is the sample's time, CPUSeconds this process's CPU time
	// meanwhile (the client's, kine's and SQLite's: all in it).
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpuSeconds"`
	// Rounds are its parts, each timed.
	Rounds []WriteRound `json:"rounds"`
	// Error says why the sample stopped short (its writes then not used).
	Error string `json:"error,omitempty"`
}

// WriteRound is one timed round of the write sample.
type WriteRound struct {
	Writes  int     `json:"writes"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// timesWrites says whether plan times a sample of migrate's writes: only
// on a SQLite datastore served through kine from plan's private copy of it
// (Options.SQLiteCopy, which the command sets only then). Never on etcd
// nor on PostgreSQL, where plan reads the live database and writes nothing:
// there the estimate keeps its model of etcd's costs (etcd's metrics;
// assumed on PostgreSQL, which has none that plan reads).
func timesWrites(env *pipeline.Env, opts Options) bool {
	api := env.Target.APIServer()
	return opts.SQLiteCopy != nil && api.OnKine() && api.KineServer == ""
}

// The write sample's shape: up to writeChunks batches of stale keys
// (consecutive in the scan, as migrate cuts its batches), chosen uniformly
// over the keyspace, written in writeRounds rounds, each timed.
const (
	writeChunks = 64
	writeRounds = 4
	// writeSampleBytes bounds the values the sample writes (kine keeps
	// each old value beside the new one, in the copy under $TMPDIR): a
	// datastore of large objects is sampled by fewer batches.
	writeSampleBytes = 32 << 20
)

// writeItem is one stale key of the write sample: what its rewrite needs
// but the value, of which its size is kept.
type writeItem struct {
	key         string
	modRevision int64
	read        etcdscan.KVMeta
	size        int
}

// chunkPage cuts the stale decisions of a page into batches as migrate
// does (batches.Pool: batchOps at a time, in the page's order) and offers
// each to the reservoir of chunks (s.mu held).
func (s *sampler) chunkPage(page []reencode.Decision) {
	var cur []writeItem
	offer := func() {
		if len(cur) == 0 {
			return
		}
		s.chunkSeen++
		switch {
		case len(s.chunks) < s.chunkN:
			s.chunks = append(s.chunks, cur)
		default:
			if j := s.rnd.Int64N(s.chunkSeen); j < int64(s.chunkN) {
				s.chunks[j] = cur
			}
		}
		cur = nil
	}
	for i := range page {
		d := &page[i]
		if d.Status != reencode.Stale {
			continue
		}
		cur = append(cur, writeItem{key: d.Key, modRevision: d.ModRevision, read: d.Read, size: len(d.NewValue)})
		if len(cur) >= s.batchOps {
			offer()
		}
	}
	offer()
}

// sampleWrites writes the sample's chunks to the datastore cli reaches,
// which must be plan's private copy of a SQLite datastore (cp), with
// migrate's writer on kine and its writers in flight, and times them. Each key is written once, at the mod revision the
// decision read (nothing but plan reads the copy). A write that is not
// Written stops the sample (Error).
func (s *sampler) sampleWrites(ctx context.Context, cli *clientv3.Client, cp *SQLiteCopy, writers int) WriteSample {
	s.mu.Lock()
	chunks := s.chunks
	s.mu.Unlock()
	values := 0
	for i, ch := range chunks {
		for _, it := range ch {
			values += it.size
		}
		if values > writeSampleBytes {
			chunks = chunks[:i+1]
			break
		}
	}
	ws := WriteSample{Writers: writers}
	largest := 0
	for _, ch := range chunks {
		for _, it := range ch {
			largest = max(largest, it.size)
		}
	}
	zeros := make([]byte, largest)
	w := &etcdscan.Writer{Client: cli, Kine: true}
	rounds := min(writeRounds, len(chunks))
	cpu0 := cpuTime()
	start := time.Now()
	for r := range rounds {
		part := chunks[r*len(chunks)/rounds : (r+1)*len(chunks)/rounds]
		round, err := writeChunksOnce(ctx, w, part, zeros, writers)
		if err != nil {
			ws.Error = fmt.Sprintf("writing plan's copy %s of %s: %v", cp.Copy, cp.Datastore, err)
			break
		}
		ws.Rounds = append(ws.Rounds, round)
		ws.Writes += round.Writes
		ws.Batches += len(part)
		ws.Bytes += round.Bytes
	}
	ws.Seconds = time.Since(start).Seconds()
	ws.CPUSeconds = (cpuTime() - cpu0).Seconds()
	return ws
}

// writeChunksOnce writes chunks through w with writers batches in flight,
// as migrate's writers take them (batches.Pool), and says how long it took.
func writeChunksOnce(ctx context.Context, w *etcdscan.Writer, chunks [][]writeItem, zeros []byte, writers int) (WriteRound, error) {
	var r WriteRound
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pool := batches.Start(writers, 0, cancel, func(b []etcdscan.Put) error {
		for _, res := range w.Write(wctx, b) {
			if res.Status != etcdscan.Written {
				if res.Err != nil {
					return fmt.Errorf("%s: %w", res.Status, res.Err) // names the key
				}
				return fmt.Errorf("%s: %s", res.Key, res.Status)
			}
		}
		return nil
	})
	start := time.Now()
	for _, ch := range chunks {
		puts := make([]etcdscan.Put, len(ch))
		for i, it := range ch {
			puts[i] = etcdscan.Put{Key: it.key, Value: zeros[:it.size], ModRevision: it.modRevision, Read: it.read}
			r.Bytes += guard.PutCostSize(len(it.key), it.size)
		}
		r.Writes += len(puts)
		if err := pool.Send(wctx, puts); err != nil {
			break
		}
	}
	err := pool.Wait()
	r.Seconds = time.Since(start).Seconds()
	if err == nil {
		err = ctx.Err()
	}
	return r, err
}
