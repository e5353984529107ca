// etcd's errors, interpreted once: what a refusal means (a full database, a
// permission, an unavailable cluster, a request too large, a history
// compacted) and whether a retry can help. No other package of the tool
// inspects etcd's error codes.

package etcdscan

import (
	"context"
	"errors"
	"go.etcd.io/raft/v3"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Causes of a FatalError.
const (
	// CauseNoSpace: etcd's NOSPACE alarm is raised (the backend reached
	// --quota-backend-bytes); etcd refuses every put of every client until
	// the alarm is disarmed.
	CauseNoSpace = "etcd-out-of-space"
	// CausePermission: etcd refused the credentials or the user's permissions.
	CausePermission = "etcd-permission-denied"
	// CauseUnavailable: etcd did not answer a write through every retry
	// (the members the client was given are down or cut off, or the
	// cluster has no leader): every later write would wait out the same
	// retries. The error is an *UnavailableError.
	CauseUnavailable = "etcd-unavailable"
)

// FatalError is an etcd refusal that no retry fixes: every later write would
// be refused the same way until an operator acts.
type FatalError struct {
	Cause string // CauseNoSpace, CausePermission or CauseUnavailable
	Err   error
}

func (e *FatalError) Error() string { return e.Err.Error() }

func (e *FatalError) Unwrap() error { return e.Err }

// AsFatal returns err as a *FatalError when it (or what it wraps) is one, or
// is an etcd error that no retry fixes; nil otherwise.
func AsFatal(err error) *FatalError {
	if err == nil {
		return nil
	}
	var fe *FatalError
	if errors.As(err, &fe) {
		return fe
	}
	if IsNoSpace(err) {
		return &FatalError{Cause: CauseNoSpace, Err: err}
	}
	for _, e := range []error{rpctypes.ErrPermissionDenied, rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty, rpctypes.ErrInvalidAuthToken} {
		if errors.Is(err, e) {
			return &FatalError{Cause: CausePermission, Err: err}
		}
	}
	if s, ok := status.FromError(err); ok && (s.Code() == codes.PermissionDenied || s.Code() == codes.Unauthenticated) {
		return &FatalError{Cause: CausePermission, Err: err}
	}
	return nil
}

// IsNoSpace reports whether etcd refused a request because its NOSPACE alarm
// is raised ("etcdserver: mvcc: database space exceeded").
func IsNoSpace(err error) bool {
	if errors.Is(err, rpctypes.ErrNoSpace) || errors.Is(err, rpctypes.ErrGRPCNoSpace) {
		return true
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.ResourceExhausted && s.Message() == rpctypes.ErrorDesc(rpctypes.ErrGRPCNoSpace) {
		return true
	}
	return err != nil && strings.Contains(err.Error(), rpctypes.ErrorDesc(rpctypes.ErrGRPCNoSpace))
}

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

// IsPermissionDenied reports whether etcd refused a request for lack of the
// user's permission on its keys (auth on): the user is known, the keys are
// not its to read or write.
func IsPermissionDenied(err error) bool {
	return errors.Is(err, rpctypes.ErrPermissionDenied) || errors.Is(err, rpctypes.ErrGRPCPermissionDenied) ||
		errors.Is(err, rpctypes.ErrUserEmpty) || errors.Is(err, rpctypes.ErrGRPCUserEmpty)
}

// IsCompacted reports whether etcd refused a request at a revision its
// history no longer holds.
func IsCompacted(err error) bool { return errors.Is(err, rpctypes.ErrCompacted) }

// IsLeaseNotFound reports whether etcd refused a request for a lease it does
// not have (expired, or revoked).
func IsLeaseNotFound(err error) bool { return errors.Is(err, rpctypes.ErrLeaseNotFound) }
