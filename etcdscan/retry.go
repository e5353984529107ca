package etcdscan

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultRetries bounds the attempts made for one request on transient errors.
const DefaultRetries = 8

// isTransient reports whether err is worth retrying: the cluster is electing a
// leader, a member is unavailable or overloaded, or one request timed out
// while the caller's context is still live.
func isTransient(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	for _, t := range []error{
		rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrNotLeader,
		rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrTimeoutWaitAppliedIndex, rpctypes.ErrStopped, rpctypes.ErrTooManyRequests,
		rpctypes.ErrUnhealthy,
	} {
		if errors.Is(err, t) {
			return true
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true // the per-request timeout, the caller's context is live
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return true
		}
	}
	return false
}

// isTooLarge reports whether etcd refused a request for its size or op count.
func isTooLarge(err error) bool {
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrTooManyOps) {
		return true
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.ResourceExhausted {
		return true // gRPC message limit (request far above --max-request-bytes)
	}
	return false
}

// backoff sleeps before retry number attempt (1-based): 100ms doubling up to
// 5s, with jitter. It returns the context's error if it ends first.
func backoff(ctx context.Context, attempt int) error {
	d := 100 * time.Millisecond << min(attempt-1, 6)
	if d > 5*time.Second {
		d = 5 * time.Second
	}
	d = d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// withRetry runs op with a per-attempt timeout, retrying transient errors up
// to retries times. ambiguous is set when an attempt failed in a way that may
// still have been applied (relevant for writes).
func withRetry(ctx context.Context, timeout time.Duration, retries int, op func(ctx context.Context) error) (ambiguous bool, err error) {
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, timeout)
		err = op(actx)
		cancel()
		if err == nil || !isTransient(ctx, err) || attempt >= retries {
			if ctx.Err() != nil && err != nil {
				return ambiguous, ctx.Err()
			}
			return ambiguous, err
		}
		ambiguous = true
		if berr := backoff(ctx, attempt+1); berr != nil {
			return ambiguous, berr
		}
	}
}
