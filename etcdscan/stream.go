package etcdscan

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errNoStream: etcd does not serve RangeStream (before 3.7, or a proxy
// that does not forward it).
var errNoStream = errors.New("etcd does not serve RangeStream")

// errChunkTooLarge: a chunk of the stream was above MaxChunkBytes; gRPC
// refused it before reading it.
var errChunkTooLarge = errors.New("a RangeStream chunk above the scan's limit")

// chunkCap is etcd's KV client whose RangeStream refuses a chunk (one gRPC
// message) above max bytes; the client's other calls are left as they are.
type chunkCap struct {
	pb.KVClient
	max int
}

func (c chunkCap) RangeStream(ctx context.Context, in *pb.RangeRequest, opts ...grpc.CallOption) (pb.KV_RangeStreamClient, error) {
	return c.KVClient.RangeStream(ctx, in, append(opts, grpc.MaxCallRecvMsgSize(c.max))...)
}

// stream reads [key, end) at the pinned revision through etcd's RangeStream
// (3.7 and later): one request whose answer comes in chunks of about etcd's
// --max-request-bytes, each read by etcd from where the last ended and none
// counting the keys after it (a limited range request counts them all; see
// RangeWalk). Each chunk is handed to send a page of PageSize keys at a
// time, so the consumer sees what a walk gives it. A compaction of the
// pinned revision, or a transient error, ends the stream; it is opened
// again after the last key read, at the current revision for a compaction
// (a Restart, as a page does), after a backoff for a transient error (the
// retries start over once a chunk arrives). A chunk that takes longer than
// CommandTimeout to come is a transient error. When etcd has no RangeStream
// stream returns errNoStream and the key to read on from.
//
// etcd reads a chunk with a key limit that starts at 10 and doubles while
// chunks are under half its --max-request-bytes, and halves only after a
// chunk over twice that: after many small keys (node leases) the limit is
// in the thousands, and if large values follow (the nodes) the next chunk
// holds thousands of them (measured: 890 20 KiB nodes, 18 MB, after 5,000
// leases; 5,000 nodes would make 50-100 MB), read by etcd and held here at
// once. A chunk above MaxChunkBytes is refused by gRPC before it is read
// (chunkCap): stream returns errChunkTooLarge and the key to read on from,
// and the caller pages for a while before a new stream.
func (p *producer) stream(ctx context.Context, key, end string, send func([]KV) error) (string, error) {
	attempt := 0
	backoff := retryBackoff
	for {
		if p.rev == 0 {
			// A stream tells its revision only in its last chunk: pin it
			// first with the read of one key.
			if _, err := p.get(ctx, key); err != nil {
				return key, err
			}
		}
		if p.firstRev == 0 {
			p.firstRev = p.rev // a revision the caller gave
		}
		next, got, err := p.streamOnce(ctx, key, end, send)
		key = next
		if err == nil {
			return key, nil
		}
		if got {
			attempt, backoff = 0, retryBackoff
		}
		switch {
		case errors.Is(err, errNoStream), errors.Is(err, errChunkTooLarge):
			return key, err
		case p.compacted(err):
			continue
		case isTransient(ctx, err) && attempt < p.opts.Retries:
			attempt++
			t := time.NewTimer(backoff.Step())
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return key, ctx.Err()
			}
			continue
		}
		if ctx.Err() != nil {
			return key, ctx.Err()
		}
		if isTransient(ctx, err) {
			err = &UnavailableError{Endpoints: p.cli.Endpoints(), Attempts: p.opts.Retries + 1, Timeout: p.opts.CommandTimeout, Err: err}
		}
		return key, fmt.Errorf("scan %q at revision %d: %w", key, p.rev, err)
	}
}

// streamOnce is one RangeStream request from key: it returns the key to go
// on from, whether any chunk came, and why it ended (nil: the range is read).
func (p *producer) streamOnce(ctx context.Context, key, end string, send func([]KV) error) (next string, got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.streams++
	chunks, err := p.streamKV.GetStream(sctx, key, clientv3.WithRange(end), clientv3.WithRev(p.rev))
	if err != nil {
		return key, false, streamError(err)
	}
	defer func() {
		// The client's receiver sends its last error before it closes
		// the channel: let it, whatever ended the stream here.
		cancel()
		for range chunks {
		}
	}()
	timer := time.NewTimer(p.opts.CommandTimeout)
	defer timer.Stop()
	for {
		timer.Reset(p.opts.CommandTimeout)
		var chunk clientv3.RangeStreamResponse
		var open bool
		select {
		case chunk, open = <-chunks:
		case <-timer.C:
			return key, got, fmt.Errorf("no answer within %s: %w", p.opts.CommandTimeout, context.DeadlineExceeded)
		case <-ctx.Done():
			return key, got, ctx.Err()
		}
		if !open {
			// etcd ends a stream after the chunk that carries its header.
			return key, got, fmt.Errorf("the stream ended before its last chunk: %w", rpctypes.ErrTimeoutDueToConnectionLost)
		}
		if err := chunk.Err(); err != nil {
			return key, got, streamError(err)
		}
		if chunk.RangeResponse == nil {
			continue
		}
		for kvs := chunk.Kvs; len(kvs) > 0; {
			n := min(len(kvs), int(p.opts.PageSize))
			page := toKVs(kvs[:n])
			kvs = kvs[n:]
			p.lastKey = page[n-1].Key
			key = p.lastKey + "\x00"
			got = true
			if err := send(page); err != nil {
				return key, got, err
			}
		}
		if chunk.Header != nil {
			return key, got, nil // the last chunk
		}
	}
}

// streamError is an error of RangeStream as the rest of the scan knows
// them: errNoStream for a server that does not serve it, errChunkTooLarge
// for a chunk gRPC refused by its size (etcd's "too many requests" has the
// same code, ResourceExhausted, and is transient).
func streamError(err error) error {
	s, _ := status.FromError(err)
	switch {
	case s.Code() == codes.Unimplemented:
		return fmt.Errorf("%w: %v", errNoStream, err)
	case s.Code() == codes.ResourceExhausted && strings.Contains(s.Message(), "larger than max"):
		return fmt.Errorf("%w: %v", errChunkTooLarge, err)
	}
	return err
}

// toKVs copies etcd's answer into the scan's KVs.
func toKVs(kvs []*mvccpb.KeyValue) []KV {
	out := make([]KV, len(kvs))
	for i, kv := range kvs {
		out[i] = KV{
			Key:            string(kv.Key),
			Value:          kv.Value,
			ModRevision:    kv.ModRevision,
			CreateRevision: kv.CreateRevision,
			Version:        kv.Version,
			Lease:          kv.Lease,
		}
	}
	return out
}
