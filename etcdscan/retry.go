package etcdscan

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
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
		switch {
		case s.Code() == codes.Unavailable, s.Code() == codes.DeadlineExceeded:
			return true
		case s.Code() == codes.Unknown && (s.Message() == raft.ErrProposalDropped.Error() || s.Message() == raft.ErrStopped.Error()):
			// etcd (3.5, 3.6 and 3.7) hands raft's own errors to the client, with
			// no rpctypes error of their own: the member could not propose
			// the request (a leader transfer is under way, or it knows no
			// leader: nothing was applied), or its raft stopped under the
			// request (the member is going down: the request may have been
			// committed, which the caller's ambiguity check covers). Another
			// member, or the next leader, takes it.
			return true
		}
	}
	return false
}

// isTooLarge reports whether etcd refused a request for its size or op count.
func isTooLarge(err error) bool {
	if IsNoSpace(err) {
		return false // also ResourceExhausted, but no split fits
	}
	if errors.Is(err, rpctypes.ErrRequestTooLarge) || errors.Is(err, rpctypes.ErrTooManyOps) {
		return true
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.ResourceExhausted {
		return true // gRPC message limit (request far above --max-request-bytes)
	}
	return false
}

// retryBackoff is the wait between attempts: 100ms doubling up to 5s, plus up
// to half again at random, for as many retries as the caller allows.
var retryBackoff = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: DefaultRetries, Cap: 5 * time.Second}

// withRetry runs op with a per-attempt timeout, retrying transient errors up
// to retries times with retryBackoff between attempts (apimachinery's wait
// loop; etcd's client retries only reads on an unavailable member, and says
// nothing about whether a failed write may have been applied). ambiguous is
// set when an attempt failed in a way that may still have been applied
// (relevant for writes). The error is op's last, or the context's.
func withRetry(ctx context.Context, timeout time.Duration, retries int, op func(ctx context.Context) error) (ambiguous bool, err error) {
	attempt := 0
	werr := retryBackoff.DelayFunc().Until(ctx, true, true, func(ctx context.Context) (bool, error) {
		actx, cancel := context.WithTimeout(ctx, timeout)
		err = op(actx)
		cancel()
		if err == nil {
			return true, nil
		}
		if !isTransient(ctx, err) || attempt >= retries {
			return false, err
		}
		attempt++
		ambiguous = true
		return false, nil
	})
	if ctx.Err() != nil && (err != nil || werr != nil) {
		return ambiguous, ctx.Err()
	}
	return ambiguous, werr
}
