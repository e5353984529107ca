package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"kube-etcd-migrate/etcdscan"
)

// checkPrefix refuses a prefix under which etcd holds nothing while it holds
// other keys (*PrefixError): most likely kube-apiserver runs with a different
// --etcd-prefix.
func checkPrefix(ctx context.Context, src etcdscan.Source, prefix string) error {
	rctx, cancel := context.WithTimeout(ctx, etcdscan.DefaultScanCommandTimeout)
	defer cancel()
	in, err := firstKey(rctx, src, strings.TrimSuffix(prefix, "/")+"/")
	if err != nil {
		return fmt.Errorf("count keys under the prefix %s: %w", prefix, err)
	}
	if in != "" {
		return nil
	}
	first, err := firstKey(rctx, src, "")
	if err != nil {
		return fmt.Errorf("count keys under the prefix %s: %w", prefix, err)
	}
	if first == "" {
		return nil // an empty etcd: nothing to do, nothing wrong
	}
	if len(first) > 80 {
		first = first[:80] + "…"
	}
	return &PrefixError{Prefix: prefix, First: first}
}

// PrefixError is a prefix (Config.Prefix) under which etcd holds nothing
// while it holds other keys.
type PrefixError struct {
	Prefix string
	First  string // the first key etcd holds
}

func (e *PrefixError) Error() string {
	return fmt.Sprintf("prefix %s: etcd has no keys under it, but has others (first: %q); it should be kube-apiserver's --etcd-prefix", e.Prefix, e.First)
}

// RevisionError is a revision (Config.Revision) etcd cannot serve.
type RevisionError struct {
	Revision int64
	Msg      string // what is wrong with it
	Err      error
}

func (e *RevisionError) Error() string { return fmt.Sprintf("revision %d%s", e.Revision, e.Detail()) }

// Detail is what is wrong, after the revision: ": etcd is at revision 9" or
// " is compacted: ...".
func (e *RevisionError) Detail() string {
	if e.Err != nil {
		return ": " + e.Err.Error()
	}
	return e.Msg
}

func (e *RevisionError) Unwrap() error { return e.Err }

// firstKey is the first key under prefix ("" for none): a scan stopped at
// its first page of one key.
func firstKey(ctx context.Context, src etcdscan.Source, prefix string) (string, error) {
	var key string
	_, err := src.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{prefix}, PageSize: 1}, func(page []etcdscan.KV) error {
		if len(page) > 0 {
			key = page[0].Key
			return errFound
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		return "", err
	}
	return key, nil
}

// checkRevision refuses a revision etcd cannot serve (*RevisionError): in
// the future, or compacted (etcd keeps no older values).
func checkRevision(ctx context.Context, src etcdscan.Source, rev int64) error {
	if rev == 0 {
		return nil
	}
	if rev < 0 {
		return &RevisionError{Revision: rev, Msg: ": must be positive"}
	}
	rctx, cancel := context.WithTimeout(ctx, etcdscan.DefaultScanCommandTimeout)
	defer cancel()
	cur, compacted, err := src.Revisions(rctx)
	if err != nil {
		return &RevisionError{Revision: rev, Err: err}
	}
	if rev > cur {
		return &RevisionError{Revision: rev, Msg: fmt.Sprintf(": etcd is at revision %d", cur)}
	}
	if rev < compacted {
		return &RevisionError{Revision: rev, Msg: fmt.Sprintf(" is compacted: the oldest revision etcd still has is %d", compacted)}
	}
	return nil
}
