package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/crash"
	"kube-etcd-migrate/reencode"
)

// Mode says how much work Run does per key.
type Mode int

// Run scans the selected prefixes at one revision and calls fn once per page with
// the decisions of that page, in key order. A revision given (not 0) is kept: its
// compaction during the scan is an error, where the current revision, pinned at
// the first page, moves on to a newer one and says so in the stats. Decoding and
// deciding run on Config.Concurrency goroutines and overlap fn: while fn handles
// one page (migrate writes it), the next is fetched and decoded. At most four
// pages are held at once (one prefetched by the scan, one being decoded, one
// queued, one in fn). A panic of fn or of a decision is returned as a
// *crash.Panic, before any other error.
func (e *Env) Run(ctx context.Context, revision int64, mode Mode, fn func(page []reencode.Decision) error) (etcdscan.ScanStats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	decided := make(chan []reencode.Decision, 1)
	var fnErr, decideErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for page := range decided {
			if fnErr != nil {
				continue // drain
			}
			err := func() (err error) {
				defer crash.Recover("handling a page of decisions", &err)
				return fn(page)
			}()
			if err != nil {
				fnErr = err
				cancel()
			}
		}
	}()
	opts := etcdscan.ScanOptions{Prefixes: e.Prefixes, Revision: revision, KeepRevision: revision > 0, PageSize: e.Config.PageSize}
	stats, err := e.Source.Scan(ctx, opts, func(page []etcdscan.KV) error {
		page = e.skip(page)
		if len(page) == 0 {
			return nil
		}
		out, err := e.decidePage(ctx, page, mode)
		if err != nil {
			decideErr = err
			cancel()
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		select {
		case decided <- out:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	close(decided)
	<-done
	for _, err := range []error{fnErr, decideErr, err} {
		if _, ok := err.(*crash.Panic); ok {
			return stats, err
		}
	}
	if fnErr != nil {
		return stats, fnErr
	}
	var dep *DependencyError
	if errors.As(decideErr, &dep) {
		return stats, decideErr
	}
	return stats, err
}

// DependencyError stops a run: a decision found something every remaining
// object may need gone in the middle of it — a KMS plugin that does not
// answer (*encryption.KMSPluginError: each value under a data key not yet
// decrypted would wait out the plugin's timeout), the write encryption
// provider failing after it worked (*encryption.EncryptError), a conversion webhook that
// stopped answering (*customresource.WebhookDownError). Such an object is
// no fault of its own: it is not reported unreadable, and Run returns this
// at once (the page it was found in is not handed on; the decisions under
// way are cancelled).
type DependencyError struct {
	Key string // the object whose decision found it
	Err error
}

func (e *DependencyError) Error() string {
	return fmt.Sprintf("%v (found at %s)", e.Err, e.Key)
}

func (e *DependencyError) Unwrap() error { return e.Err }

// dependencyDown is the dependency an unreadable decision found gone (nil:
// the object's own failure, or none).
func dependencyDown(d reencode.Decision) error {
	if d.Status != reencode.Unreadable || d.Err == nil {
		return nil
	}
	var kp *encryption.KMSPluginError
	if errors.As(d.Err, &kp) && kp.Unreachable() {
		return kp
	}
	var ee *encryption.EncryptError
	if errors.As(d.Err, &ee) && ee.Stopped {
		return ee
	}
	var wd *customresource.WebhookDownError
	if errors.As(d.Err, &wd) {
		return wd
	}
	return nil
}

// decidePage decodes (and decides) one page on Config.Concurrency goroutines and
// applies the resource filter. A panic of a decision is its error, a
// *crash.Panic naming the key; a decision that found something the run
// depends on gone (DependencyError) stops the page at once: no more of its
// keys are decided, those being decided are cancelled.
func (e *Env) decidePage(ctx context.Context, page []etcdscan.KV, mode Mode) ([]reencode.Decision, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := make([]reencode.Decision, len(page))
	var wg sync.WaitGroup
	next := make(chan int)
	workers := min(e.Config.Concurrency, len(page))
	crashed := make([]error, workers)
	var stopOnce sync.Once
	var stop error
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := ""
			defer func() {
				if v := recover(); v != nil {
					crashed[w] = crash.New("deciding "+key, v)
					for range next { // the feed does not wait for this worker
					}
				}
			}()
			for i := range next {
				key = page[i].Key
				crash.At("decide")
				out[i] = e.DecideOne(ctx, page[i], mode)
				if err := dependencyDown(out[i]); err != nil {
					stopOnce.Do(func() {
						stop = &DependencyError{Key: key, Err: err}
						cancel()
					})
				}
			}
		}()
	}
feed:
	for i := range page {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	for _, err := range crashed {
		if err != nil {
			return nil, err
		}
	}
	if stop != nil {
		return nil, stop
	}
	if e.Filter != nil {
		kept := out[:0]
		for _, d := range out {
			if d.Status == reencode.NotObject || e.Filter[d.Resource] {
				kept = append(kept, d)
			}
		}
		out = kept
	}
	return out, nil
}

// DecideOne decodes one key and, in Decide or Classify mode, decides what to do
// with it.
func (e *Env) DecideOne(ctx context.Context, kv etcdscan.KV, mode Mode) reencode.Decision {
	obj, err := e.Decoder.Decode(ctx, kv)
	switch mode {
	case DecodeOnly:
		return reencode.Describe(obj, err)
	case Classify:
		return e.Planner.Classify(ctx, obj, err)
	}
	return e.Planner.Decide(ctx, obj, err)
}
