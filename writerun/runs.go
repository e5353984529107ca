package writerun

import (
	"context"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/clusterlock"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/undo"
)

// The read side of writing runs: what a state directory keeps of them and
// what the cluster's lock records, as the commands read them ('runs',
// 'rollback --run', 'verify' of a run's files). writerun writes those
// records, so the commands read them here too, in its words: the names below
// are the undo's, the lock's and the watch's own types, which the commands
// reach through the owner of the run only.
type (
	// StateDir is where writing runs keep their run directories.
	StateDir = undo.StateDir
	// Record is a run directory's record (its run.json).
	Record = undo.Record
	// JournalSpec is a journal to read, with the run that wrote it.
	JournalSpec = undo.JournalSpec
	// JournalCheck is how a journal verified, read whole.
	JournalCheck = undo.JournalCheck
	// RunCheck is how a run's undo verified (ListRuns with verify).
	RunCheck = undo.RunCheck
	// FileSum is a file's size and checksum as its run recorded them.
	FileSum = undo.FileSum
	// MissingRun is a run whose directory was removed.
	MissingRun = undo.MissingRun
	// PruneOptions and PruneResult are StateDir.Prune's.
	PruneOptions = undo.PruneOptions
	PruneResult  = undo.PruneResult
	// ClusterRun is a run as the cluster's lock records it in etcd.
	ClusterRun = clusterlock.Run

	// SpaceReport is what a run saw of etcd's database (its space guard).
	SpaceReport = guard.SpaceReport
	// UndoFit says whether a rollback of a run fits below etcd's quota
	// after the rewrite (plan).
	UndoFit = guard.UndoFit

	// NotFoundError: no run of that ID in the state directory.
	NotFoundError = undo.NotFoundError
	// LockedError: another process holds the state directory.
	LockedError = undo.LockedError
	// GapError: a run between two asked for is missing.
	GapError = undo.GapError
	// NotPermittedError: etcd's user may not read the cluster's lock.
	NotPermittedError = clusterlock.NotPermittedError
	// WriterError: another writer appeared in the window or mid-run; the
	// run stopped.
	WriterError = liveness.WriterError
	// PluginStopError: a KMS plugin stopped answering while values were read.
	PluginStopError = undo.PluginStopError
	// NoEncryptionConfigError: values to put back are encrypted and no
	// encryption configuration was given.
	NoEncryptionConfigError = undo.NoEncryptionConfigError
)

const (
	// DefaultStateDir and EnvStateDir are the state directory's default and
	// the environment variable that changes it.
	DefaultStateDir = undo.DefaultStateDir
	EnvStateDir     = undo.EnvStateDir
	// OutputFile is the run directory's copy of what the run printed.
	OutputFile = undo.OutputFile
	// StateKilled is the state of a run that ended without recording its end.
	StateKilled = undo.StateKilled
	// DefaultLockTTL is the cluster's lock's time to live.
	DefaultLockTTL = clusterlock.DefaultTTL
	// DefaultWindow is the liveness window's default.
	DefaultWindow = liveness.DefaultWindow
	// KubeadmEtcdManifest is where kubeadm writes etcd's static-pod manifest.
	KubeadmEtcdManifest = guard.KubeadmEtcdManifest
)

// RunView is a run as 'runs' lists it: its record, its state, its undo's
// files on disk and, when asked, how its undo verified.
type RunView struct {
	Record
	// State is running (its lock held), finished, or killed (no end
	// recorded, nothing holds its lock).
	State string `json:"state"`
	// SnapshotTaken and JournalKept say whether those files are on disk;
	// SnapshotBytes and JournalBytes their sizes (what removing them frees).
	SnapshotTaken bool  `json:"snapshotTaken"`
	JournalKept   bool  `json:"journalKept"`
	SnapshotBytes int64 `json:"snapshotBytes,omitempty"`
	JournalBytes  int64 `json:"journalBytes,omitempty"`
	// UndoVerified, when verified (absent otherwise), says whether the run's
	// undo verifies, read whole (or there is nothing to undo); UndoCheck
	// says how.
	UndoVerified *bool     `json:"undoVerified,omitempty"`
	UndoCheck    *RunCheck `json:"undoCheck,omitempty"`
}

// Damaged says whether the run's undo was verified and found damaged.
func (v *RunView) Damaged() bool {
	return v.UndoCheck != nil && v.UndoCheck.Status == undo.UndoDamaged
}

// WayBack is the way back to the state before the run when its undo
// cannot be used: its snapshot, or the runs before it.
func (v *RunView) WayBack() string { return undo.WayBack(&v.Record) }

// Listing is a state directory's runs, oldest first, and the runs whose
// directories were removed.
type Listing struct {
	Runs    []RunView
	Missing []MissingRun
}

// ListRuns lists dir's runs; with verify, every byte of each run's undo
// is read (its journal's records, the checksums recorded at its end, its
// snapshot's trailer). A context ended mid-way returns its error.
func ListRuns(ctx context.Context, dir StateDir, verify bool) (*Listing, error) {
	recs, err := dir.List()
	if err != nil {
		return nil, err
	}
	missing, err := dir.Missing(recs)
	if err != nil {
		return nil, err
	}
	views := make([]RunView, len(recs))
	for i, r := range recs {
		_, jerr := os.Stat(r.Journal)
		v := RunView{Record: r, State: r.State(), SnapshotTaken: r.SnapshotTaken(), JournalKept: r.Journal != "" && jerr == nil}
		if v.SnapshotTaken {
			v.SnapshotBytes = guard.FileSize(r.Snapshot)
		}
		if v.JournalKept {
			v.JournalBytes = guard.FileSize(r.Journal)
		}
		if verify {
			v.UndoCheck = undo.CheckRun(ctx, v.Record)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			ok := v.UndoCheck.Verified()
			v.UndoVerified = &ok
			if len(v.UndoNeedsKeys) == 0 && v.UndoCheck.Journal != nil {
				v.UndoNeedsKeys = v.UndoCheck.Journal.NeedsKeys() // a killed run recorded none
			}
		}
		views[i] = v
	}
	return &Listing{Runs: views, Missing: missing}, nil
}

// ClusterRuns are the cluster's runs as its lock records them in etcd
// (every host's), and the one holding the lock now (nil: none).
func ClusterRuns(ctx context.Context, cli *clientv3.Client) ([]ClusterRun, *ClusterRun, error) {
	runs, held, err := clusterlock.List(ctx, cli)
	if err != nil {
		return nil, nil, err
	}
	if held != nil && held.Holder.Host != "" {
		h := held.Holder
		return runs, &h, nil
	}
	return runs, nil, nil
}

// LaterElsewhere are the cluster's runs kept on another host or in another
// state directory than rec's (stateDir, on this host) that took the
// cluster's lock after rec's run did.
func LaterElsewhere(runs []ClusterRun, rec Record, stateDir string) []ClusterRun {
	host, _ := os.Hostname()
	return clusterlock.Later(runs, rec.ID, rec.Start, host, stateDir)
}
