package etcdscan

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/textfmt"
)

// Writer defaults.
//
// DefaultMaxOps is 16 puts per transaction: far below etcd's default
// --max-txn-ops (128), it already amortises the raft round trip well, and when
// one key of a batch changed concurrently the single-key fallback costs at most
// 16 extra requests.
//
// DefaultMaxBytes is 1 MiB: etcd refuses requests above --max-request-bytes
// (1.5 MiB by default), and the estimate below is approximate, so a third of
// head room keeps batches from bouncing; a cluster configured lower answers
// "request is too large" and the batch is split.
const (
	DefaultMaxOps   = 16
	DefaultMaxBytes = 1 << 20
	// putOverhead approximates the protobuf framing of one compare plus one
	// put request op (field tags, lengths, mod revision, flags).
	putOverhead = 64
)

// Put is one value to write back if the key still has ModRevision.
// ModRevision 0 means "only if the key does not exist" (and the put then
// creates it, attached to Lease if that is set).
type Put struct {
	Key         string
	Value       []byte
	ModRevision int64
	// Delete removes the key, if it still has ModRevision, instead of writing Value.
	Delete bool
	// Lease is the lease a creation (ModRevision 0) is attached to; 0: none.
	// An existing key always keeps its own lease.
	Lease int64
	// Read is the key as it was read (never its value): etcd's writer
	// ignores it; an output snapshot's writer gives the new record its
	// create revision, lease and next version, as etcd's update does, and
	// tells apart keys of one transaction by its sub-revision. A writer to
	// kine (Writer.Kine) puts an existing key back with Read.Lease, the
	// key's own; given no Read at all (the zero KVMeta) it reads the key's
	// lease first.
	Read KVMeta
}

func (p Put) verb() string {
	if p.Delete {
		return "delete"
	}
	return "put"
}

// PutStatus is the outcome of one Put.
type PutStatus int

// Outcomes of a Put.
const (
	// Written: the value is stored (a Delete: the key is gone); NewModRevision
	// is its mod revision (the revision of the delete).
	Written PutStatus = iota + 1
	// Conflict: the key was modified or deleted since it was read; nothing was written.
	Conflict
	// Failed: etcd refused or could not be reached; see Err. After transient
	// errors the outcome may be unknown: re-read the key.
	Failed
)

func (s PutStatus) String() string {
	switch s {
	case Written:
		return "written"
	case Conflict:
		return "conflict"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("PutStatus(%d)", int(s))
}

// PutResult is the outcome of the Put with the same index.
type PutResult struct {
	Key            string
	Status         PutStatus
	NewModRevision int64
	Err            error // nil when Written; says why for Conflict and Failed
}

// WriterStats count what a Writer did since it was created.
type WriterStats struct {
	Txns      int64 // multi-key transactions that committed
	Fallbacks int64 // multi-key transactions whose compare failed (then written key by key)
	Singles   int64 // single-key CAS requests
	Splits    int64 // batches split because etcd found them too large
	Retries   int64 // requests retried after transient errors
}

// Observer is told of every request a Writer sends that may write: a run's
// liveness watch tells the run's own writes from others' by them.
type Observer interface {
	// Sending is called before a request carrying puts is sent (each
	// attempt of it). An error sends nothing: every put of it fails with
	// that error. Otherwise done is called once, with the request's outcome.
	Sending(puts []Put) (done func(Outcome), err error)
}

// Outcome is what became of one request sent.
type Outcome struct {
	// Revision is the revision etcd applied the request at: 0 when it was
	// not applied (its compare failed) or when that is not known.
	Revision int64
	// Unknown: the request failed in a way that may have been applied.
	Unknown bool
}

// outcomeOf is a transaction's outcome.
func outcomeOf(resp *clientv3.TxnResponse, err error) Outcome {
	switch {
	case err != nil:
		return Outcome{Unknown: true}
	case resp.Succeeded:
		return Outcome{Revision: resp.Header.Revision}
	}
	return Outcome{}
}

// Writer writes values back with compare-and-swap on each key's mod revision,
// keeping the key's lease. It is safe for concurrent use.
type Writer struct {
	Client         *clientv3.Client
	MaxOps         int           // puts per transaction (default DefaultMaxOps)
	MaxBytes       int           // approximate request bytes per transaction (default DefaultMaxBytes)
	Retries        int           // retries per request on transient errors (0: DefaultRetries; <0: none)
	CommandTimeout time.Duration // per request (default DefaultCommandTimeout)
	// Observer, when set, is told of each request before it is sent and of
	// its outcome, and may refuse it.
	Observer Observer
	// Kine: the store is kine: one key per transaction, in kube-apiserver's
	// own shapes (MaxOps and MaxBytes are not used); an existing key's
	// lease is given explicitly, as read (Put.Read.Lease), since kine
	// refuses IgnoreLease and takes the put's lease as the new row's.
	Kine bool

	txns, fallbacks, singles, splits, retries atomic.Int64
	stopped                                   atomic.Pointer[FatalError]
}

// Stopped returns the refusal that stopped the writer, nil while it writes.
// After the first error no retry fixes (AsFatal: etcd out of space, permission
// denied) the writer sends nothing more: every later put fails with that error.
func (w *Writer) Stopped() *FatalError { return w.stopped.Load() }

// stop records the first fatal error.
func (w *Writer) stop(fe *FatalError) { w.stopped.CompareAndSwap(nil, fe) }

// Stats returns the counters of the writer.
func (w *Writer) Stats() WriterStats {
	return WriterStats{
		Txns: w.txns.Load(), Fallbacks: w.fallbacks.Load(), Singles: w.singles.Load(),
		Splits: w.splits.Load(), Retries: w.retries.Load(),
	}
}

func (w *Writer) maxOps() int {
	if w.MaxOps > 0 {
		return w.MaxOps
	}
	return DefaultMaxOps
}

func (w *Writer) maxBytes() int {
	if w.MaxBytes > 0 {
		return w.MaxBytes
	}
	return DefaultMaxBytes
}

func (w *Writer) retryCount() int {
	switch {
	case w.Retries < 0:
		return 0
	case w.Retries == 0:
		return DefaultRetries
	}
	return w.Retries
}

func (w *Writer) timeout() time.Duration {
	if w.CommandTimeout > 0 {
		return w.CommandTimeout
	}
	return DefaultCommandTimeout
}

func putSize(p Put) int { return 2*len(p.Key) + len(p.Value) + putOverhead }

// Write stores puts and returns one result per put, in the same order. Puts are
// grouped into transactions If(ModRevision(k)==rev ...) Then(Put(k, v,
// WithIgnoreLease()) ...) of at most MaxOps puts and about MaxBytes bytes (a
// larger single put goes alone). When a transaction's compare fails every key
// of it is retried alone, so conflicts are reported per key. A put never
// changes the key's lease. On kine (Kine) every put is a transaction of its
// own.
func (w *Writer) Write(ctx context.Context, puts []Put) []PutResult {
	res := make([]PutResult, len(puts))
	for i, p := range puts {
		res[i].Key = p.Key
	}
	if w.Kine {
		for i := range puts {
			w.writeBatch(ctx, puts, []int{i}, res)
		}
		return res
	}
	var batch []int
	size := 0
	inBatch := map[string]bool{}
	flush := func() {
		if len(batch) > 0 {
			w.writeBatch(ctx, puts, batch, res)
		}
		batch, size = nil, 0
		clear(inBatch)
	}
	for i, p := range puts {
		s := putSize(p)
		// etcd refuses a transaction that puts one key twice.
		if len(batch) > 0 && (len(batch) >= w.maxOps() || size+s > w.maxBytes() || inBatch[p.Key]) {
			flush()
		}
		batch = append(batch, i)
		size += s
		inBatch[p.Key] = true
	}
	flush()
	return res
}

func (w *Writer) writeBatch(ctx context.Context, puts []Put, idx []int, res []PutResult) {
	var stopErr error
	if fe := w.Stopped(); fe != nil {
		stopErr = fe
	} else if err := ctx.Err(); err != nil {
		stopErr = err
	}
	if stopErr != nil {
		for _, i := range idx {
			res[i].Status, res[i].Err = Failed, fmt.Errorf("%s %s: %w", puts[i].verb(), puts[i].Key, stopErr)
		}
		return
	}
	if len(idx) == 1 {
		w.single(ctx, puts[idx[0]], &res[idx[0]], false)
		return
	}
	cmps := make([]clientv3.Cmp, len(idx))
	ops := make([]clientv3.Op, len(idx))
	for j, i := range idx {
		cmps[j] = clientv3.Compare(clientv3.ModRevision(puts[i].Key), "=", puts[i].ModRevision)
		ops[j] = putOp(puts[i], false) // never on kine
	}
	var resp *clientv3.TxnResponse
	var sent []Put
	if w.Observer != nil {
		sent = make([]Put, len(idx))
		for j, i := range idx {
			sent[j] = puts[i]
		}
	}
	ambiguous, err := w.do(ctx, func(c context.Context) error {
		done, err := w.sending(sent)
		if err != nil {
			return err
		}
		var terr error
		resp, terr = w.Client.Txn(c).If(cmps...).Then(ops...).Commit()
		done(outcomeOf(resp, terr))
		return terr
	})
	fe := AsFatal(err)
	if fe != nil {
		w.stop(fe)
	}
	switch {
	case fe != nil:
		for _, i := range idx {
			res[i].Status, res[i].Err = Failed, fmt.Errorf("%s %s (in a transaction of %d keys): %w", puts[i].verb(), puts[i].Key, len(idx), fe)
		}
	case err != nil && isTooLarge(err):
		w.splits.Add(1)
		h := len(idx) / 2
		w.writeBatch(ctx, puts, idx[:h], res)
		w.writeBatch(ctx, puts, idx[h:], res)
	case err != nil:
		for _, i := range idx {
			res[i].Status, res[i].Err = Failed, fmt.Errorf("%s %s (in a transaction of %d keys): %w", puts[i].verb(), puts[i].Key, len(idx), err)
		}
	case resp.Succeeded:
		w.txns.Add(1)
		for _, i := range idx {
			res[i].Status, res[i].NewModRevision = Written, resp.Header.Revision
		}
	default:
		w.fallbacks.Add(1)
		for _, i := range idx {
			w.single(ctx, puts[i], &res[i], ambiguous)
		}
	}
}

// putOp keeps the key's lease: a put without a lease would detach the key from
// it for ever (events would never expire). On etcd an update says so
// (IgnoreLease); kine refuses that and gives the new row the put's lease,
// so an update to kine names the key's lease as read (Read.Lease).
func putOp(p Put, kine bool) clientv3.Op {
	// clientv3.OpPut takes the value as a string and copies it into the op's
	// own bytes at once; a string(p.Value) conversion would copy every value a
	// second time (about a seventh of what a key rotation allocates). The
	// string made here lives only for the OpPut call and p.Value is not
	// changed meanwhile.
	val := unsafe.String(unsafe.SliceData(p.Value), len(p.Value))
	switch {
	case p.Delete:
		return clientv3.OpDelete(p.Key)
	case p.ModRevision == 0 && p.Lease != 0:
		return clientv3.OpPut(p.Key, val, clientv3.WithLease(clientv3.LeaseID(p.Lease)))
	case p.ModRevision == 0:
		return clientv3.OpPut(p.Key, val) // creation: no lease to keep
	case kine && p.Read.Lease != 0:
		return clientv3.OpPut(p.Key, val, clientv3.WithLease(clientv3.LeaseID(p.Read.Lease)))
	case kine:
		return clientv3.OpPut(p.Key, val) // the key has no lease
	}
	return clientv3.OpPut(p.Key, val, clientv3.WithIgnoreLease())
}

// single writes one key with CAS. ambiguous says an earlier attempt for this
// key may have been applied without us seeing the answer: then a key that holds
// exactly our value is reported Written.
func (w *Writer) single(ctx context.Context, p Put, r *PutResult, ambiguous bool) {
	if fe := w.Stopped(); fe != nil {
		r.Status, r.Err = Failed, fmt.Errorf("%s %s: %w", p.verb(), p.Key, fe)
		return
	}
	if w.Kine && !p.Delete && p.ModRevision != 0 && p.Read == (KVMeta{}) {
		var ok bool
		if p.Read, ok = w.readLease(ctx, p, r); !ok {
			return
		}
	}
	var resp *clientv3.TxnResponse
	amb, err := w.do(ctx, func(c context.Context) error {
		done, err := w.sending([]Put{p})
		if err != nil {
			return err
		}
		var terr error
		defer func() { done(outcomeOf(resp, terr)) }()
		resp, terr = w.Client.Txn(c).
			If(clientv3.Compare(clientv3.ModRevision(p.Key), "=", p.ModRevision)).
			Then(putOp(p, w.Kine)).
			Else(clientv3.OpGet(p.Key)).
			Commit()
		return terr
	})
	w.singles.Add(1)
	ambiguous = ambiguous || amb
	fe := AsFatal(err)
	if fe != nil {
		w.stop(fe)
	}
	switch {
	case fe != nil:
		r.Status, r.Err = Failed, fmt.Errorf("%s %s: %w", p.verb(), p.Key, fe)
	case err != nil && isTooLarge(err):
		r.Status, r.Err = Failed, &TooLargeError{Verb: p.verb(), Key: p.Key, Bytes: len(p.Value), Err: err}
	case err != nil:
		r.Status, r.Err = Failed, fmt.Errorf("%s %s: %w", p.verb(), p.Key, err)
	case resp.Succeeded:
		r.Status, r.NewModRevision = Written, resp.Header.Revision
	default:
		var cur *int64
		var curVal []byte
		if len(resp.Responses) == 1 {
			if g := resp.Responses[0].GetResponseRange(); g != nil && len(g.Kvs) == 1 {
				cur, curVal = &g.Kvs[0].ModRevision, g.Kvs[0].Value
			}
		}
		switch {
		case cur == nil && p.Delete && ambiguous:
			// An earlier attempt deleted it.
			r.Status, r.NewModRevision = Written, resp.Header.Revision
		case cur == nil:
			r.Status, r.Err = Conflict, fmt.Errorf("%s %s: key deleted since read at mod revision %d", p.verb(), p.Key, p.ModRevision)
		case ambiguous && !p.Delete && bytes.Equal(curVal, p.Value):
			r.Status, r.NewModRevision = Written, *cur
		case p.ModRevision == 0:
			r.Status, r.Err = Conflict, fmt.Errorf("%s %s: key created meanwhile (mod revision %d)", p.verb(), p.Key, *cur)
		default:
			r.Status, r.Err = Conflict, fmt.Errorf("%s %s: key modified since read (mod revision %d, read at %d)", p.verb(), p.Key, *cur, p.ModRevision)
		}
	}
}

// readLease reads the lease of a key a put to kine updates and that its
// caller gave no Read for: without it the put would detach the key from its
// lease. The key still at the put's mod revision has the lease read (the
// put's compare makes sure it is still there); a key changed or deleted
// since is a Conflict, an error Failed (r says so, and ok is false).
func (w *Writer) readLease(ctx context.Context, p Put, r *PutResult) (read KVMeta, ok bool) {
	var resp *clientv3.GetResponse
	_, err := w.do(ctx, func(c context.Context) error {
		var gerr error
		resp, gerr = w.Client.Get(c, p.Key)
		return gerr
	})
	switch {
	case err != nil:
		if fe := AsFatal(err); fe != nil {
			w.stop(fe)
		}
		r.Status, r.Err = Failed, fmt.Errorf("%s %s: read its lease: %w", p.verb(), p.Key, err)
	case len(resp.Kvs) == 0:
		r.Status, r.Err = Conflict, fmt.Errorf("%s %s: key deleted since read at mod revision %d", p.verb(), p.Key, p.ModRevision)
	case resp.Kvs[0].ModRevision != p.ModRevision:
		r.Status, r.Err = Conflict, fmt.Errorf("%s %s: key modified since read (mod revision %d, read at %d)", p.verb(), p.Key, resp.Kvs[0].ModRevision, p.ModRevision)
	default:
		kv := resp.Kvs[0]
		return KVMeta{CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}, true
	}
	return KVMeta{}, false
}

// sending tells the Observer of a request about to be sent.
func (w *Writer) sending(puts []Put) (func(Outcome), error) {
	if w.Observer == nil {
		return func(Outcome) {}, nil
	}
	return w.Observer.Sending(puts)
}

func (w *Writer) do(ctx context.Context, op func(context.Context) error) (bool, error) {
	amb, err := withRetry(ctx, w.timeout(), w.retryCount(), op)
	if amb {
		w.retries.Add(1)
	}
	if isTransient(ctx, err) {
		// Every retry met etcd unavailable, the caller's context live:
		// each later write would wait out the same retries.
		err = &FatalError{Cause: CauseUnavailable, Err: &UnavailableError{
			Endpoints: w.Client.Endpoints(), Attempts: w.retryCount() + 1, Timeout: w.timeout(), Err: err}}
	}
	return amb, err
}

// UnavailableError is a write etcd did not answer through every retry.
type UnavailableError struct {
	Endpoints []string      // the endpoints the client was given
	Attempts  int           // the attempts made
	Timeout   time.Duration // each attempt's
	Err       error         // the last attempt's error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("etcd at %s did not answer (%d attempts, each given %s): %s",
		strings.Join(e.Endpoints, ","), e.Attempts, e.Timeout, textfmt.OneLine(e.Err.Error()))
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// TooLargeError is a write etcd refused for its size: a request larger than
// the server's --max-request-bytes.
type TooLargeError struct {
	Verb  string // what the write was
	Key   string
	Bytes int // the value's size
	Err   error
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s %s (%d bytes): larger than etcd accepts (--max-request-bytes): %v", e.Verb, e.Key, e.Bytes, e.Err)
}

func (e *TooLargeError) Unwrap() error { return e.Err }
