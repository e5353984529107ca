package etcdscan

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// DefaultRetries bounds the attempts made for one request on transient errors.
const DefaultRetries = 8

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
