package verify

import (
	"context"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/snapshotdb"
)

// Output is what OutputSnapshot built and found.
type Output struct {
	// Written is the output as built.
	Written snapshotdb.WriteResult
	// Leases is how many leases the output holds, read back.
	Leases int
	// Report is the output's verification.
	Report *Report
}

// OutputSnapshot finishes the output snapshot a run on the snapshot file in
// wrote through w (force: an existing file is replaced), then opens it
// afresh, read in place as a restore after a disaster would read it, and
// verifies it with cfg, the run's configuration (its SnapshotFile and
// Revision become the output's). in is closed once the output is built (its
// key index done with before the output's is). The errors name the output.
func OutputSnapshot(ctx context.Context, w *snapshotdb.Writer, in *snapshotdb.File, force bool, cfg pipeline.Config) (*Output, error) {
	res, err := w.Finish(ctx, force)
	_ = in.Close()
	if err != nil {
		return nil, err
	}
	out := res.Path
	f, err := snapshotdb.Open(out, snapshotdb.Options{})
	if err != nil {
		return nil, input.Errorf("%s %s: written, but does not open again: %w", input.OutputSnapshot, out, err)
	}
	defer f.Close()
	if f.Info.Revision != res.Revision {
		return nil, input.Errorf("%s %s: written at revision %d, but reads at revision %d", input.OutputSnapshot, out, res.Revision, f.Info.Revision)
	}
	o := &Output{Written: res, Leases: f.Info.Leases}
	cfg.SnapshotFile, cfg.Revision = out, 0
	env, err := pipeline.SetupSource(ctx, f, cfg)
	if err != nil {
		return o, input.Errorf("%s %s: verify: %w", input.OutputSnapshot, out, err)
	}
	defer env.Close()
	if o.Report, err = Run(ctx, env, Options{ShowKeys: -1}); err != nil {
		return o, input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	return o, nil
}
