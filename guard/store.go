package guard

import (
	"context"
	"errors"
	"fmt"
	"os"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/pipeline"
)

// Store is where a run writes, with compare-and-swap on each key's mod
// revision, and reads back what it wrote: etcd (an etcdscan.Writer and the
// client's reads), or an output snapshot's writer (snapshotdb.Writer).
type Store interface {
	// Write stores puts; one result per put, in order (etcdscan.Writer.Write).
	Write(ctx context.Context, puts []etcdscan.Put) []etcdscan.PutResult
	// Stopped is the refusal no retry fixes that stopped the store, if any.
	Stopped() *etcdscan.FatalError
	Stats() etcdscan.WriterStats
	// Get reads key as the store now holds it, with the run's writes.
	Get(ctx context.Context, key string) (etcdscan.KV, bool, error)
}

// EtcdStore is etcd as a Store.
type EtcdStore struct{ *etcdscan.Writer }

// Get reads key from etcd at its current revision.
func (s EtcdStore) Get(ctx context.Context, key string) (etcdscan.KV, bool, error) {
	return etcdscan.ClientSource{Client: s.Client}.Get(ctx, key, 0)
}

// OutputPreflight is the preflight of a run that writes the output snapshot
// out instead of to etcd (migrate's Options.Output): OutputSpace, and the
// write encryption providers work.
func OutputPreflight(ctx context.Context, env *pipeline.Env, out string, opts PreflightOptions) ([]string, error) {
	done, err := OutputSpace(env.Config.SnapshotFile, out, opts)
	if err != nil {
		return done, err
	}
	if err := CheckEncryption(ctx, env); err != nil {
		return done, err
	}
	return append(done, "write encryption providers encrypt and decrypt a probe value"), nil
}

// OutputSpace is what a run that writes the output snapshot out from the
// snapshot file in checks first: in is a file no kube-apiserver reaches,
// never modified; the output's filesystem has room for about the input's
// size (the output holds each live key once, the run's new values beside
// it until it is built).
func OutputSpace(in, out string, opts PreflightOptions) ([]string, error) {
	done := []string{"no kube-apiserver can reach " + in + ": a snapshot file, read in place and never modified (it is the undo)"}
	fi, err := os.Stat(in)
	if err != nil {
		return done, fmt.Errorf("snapshot file %s: %w", in, err)
	}
	_, err = CheckDiskSpace([]DiskNeed{{What: "output snapshot", Path: out, Bytes: fi.Size()}})
	var se *DiskSpaceError
	if errors.As(err, &se) {
		return done, &PreflightError{Err: input.Errorf("not enough disk space on the filesystem of %s for %s %s: about %s (the input's size) and %s left free, %s is free; free room there, or write the output elsewhere",
			se.Dir, input.OutputSnapshot, out, textfmt.Bytes(fi.Size()), textfmt.Bytes(DiskMargin), textfmt.Bytes(se.Free))}
	}
	if err != nil {
		return done, err
	}
	return append(done, fmt.Sprintf("disk space for %s %s: at most about the input's size, %s (each live key once; the new values kept beside it until it is built)", opts.spell()(input.OutputSnapshot), out, textfmt.Bytes(fi.Size()))), nil
}
