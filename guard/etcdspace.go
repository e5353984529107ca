package guard

// Room for the whole filesystem: a writing run needs on disk its own undo
// (snapshot and journal), room for etcd's own growth on the filesystem of
// etcd's data directory (which on a kubeadm node is the state directory's:
// both under /var), and room for a later rollback's own undo (its snapshot
// of the database after the run, its journal) and etcd's growth from that
// rollback, so that the undo can still be used when it is needed. The
// filesystems are told apart by their device IDs (stat), as CheckDiskSpace
// groups its needs.

import (
	"errors"
	"fmt"
	"kube-etcd-migrate/undo"
	"os"
	"path/filepath"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/etcdscan"
)

// KubeadmEtcdManifest is where kubeadm writes etcd's static-pod manifest.
const KubeadmEtcdManifest = "/etc/kubernetes/manifests/etcd.yaml"

// EtcdData is etcd's data directory on this host, as far as the tool knows
// it: Dir ("" when unknown) and where it comes from, or why it is unknown.
type EtcdData struct {
	Dir    string `json:"dir,omitempty"`
	Source string `json:"source"`
}

// FindEtcdData finds etcd's data directory on this host: known, when the
// installer's layout named it (package installer: k3s has no etcd manifest,
// RKE2's etcd reads a configuration file), else --data-dir of etcd's
// static-pod manifest beside kube-apiserver's (apiserverManifest; "" when
// none), else of kubeadm's (KubeadmEtcdManifest) when it is there, mapped
// through the manifest's hostPath volumes. A data directory that is not on
// this host is unknown, said so.
func FindEtcdData(apiserverManifest string, known EtcdData) EtcdData {
	if known.Dir == "" && known.Source != "" {
		return known // none on this host, said why (a database server's datastore)
	}
	if known.Dir != "" {
		if _, err := os.Stat(known.Dir); err != nil {
			return EtcdData{Source: fmt.Sprintf("unknown: etcd's data directory %s (%s) is not on this host: %v", known.Dir, known.Source, errors.Unwrap(err))}
		}
		return known
	}
	file := ""
	if apiserverManifest != "" {
		f, err := apiserverconfig.EtcdManifestBeside(apiserverManifest)
		if err != nil {
			return EtcdData{Source: "unknown: " + err.Error()}
		}
		file = f
	} else if _, err := os.Stat(KubeadmEtcdManifest); err == nil {
		file = KubeadmEtcdManifest
	} else {
		return EtcdData{Source: "unknown: no kube-apiserver manifest to find etcd's beside, and no " + KubeadmEtcdManifest}
	}
	m, err := apiserverconfig.ReadEtcdMember(file)
	switch {
	case err != nil:
		return EtcdData{Source: "unknown: " + err.Error()}
	case m.DataDir == "":
		return EtcdData{Source: "unknown: etcd's manifest " + file + " sets no --data-dir"}
	case m.HostDataDir == "":
		return EtcdData{Source: fmt.Sprintf("unknown: --data-dir %s of etcd's manifest %s is under none of its hostPath volumes", m.DataDir, file)}
	}
	if _, err := os.Stat(m.HostDataDir); err != nil {
		return EtcdData{Source: fmt.Sprintf("unknown: --data-dir %s of etcd's manifest %s is %s on this host: %v", m.DataDir, file, m.HostDataDir, errors.Unwrap(err))}
	}
	return EtcdData{Dir: m.HostDataDir, Source: fmt.Sprintf("--data-dir of etcd's manifest %s", file)}
}

// WALSegment is the size etcd preallocates each WAL file at.
const WALSegment = 64 << 20

// EtcdGrowth is what etcd's data directory grows by when writes bytes are
// added to its backend: the database file beyond the pages it has free, up
// to the quota (etcd refuses writes past it, and the tool's guard stops
// before), and the WAL, which logs every write (in files of WALSegment)
// until etcd's next snapshot lets it purge them.
func EtcdGrowth(writes int64, st etcdscan.StatusInfo, quota int64) (db, wal int64) {
	db = min(max(writes-st.Free, 0), max(quota-st.DBSize, 0))
	wal = (writes + WALSegment - 1) / WALSegment * WALSegment
	return db, wal
}

// RunSpace is what a writing run puts on disk, for Needs.
type RunSpace struct {
	// Snapshot and Journal are where the run's own undo goes ("": none),
	// JournalBytes about how large its journal grows; the snapshot is the
	// database (Status.DBSize).
	Snapshot, Journal string
	JournalBytes      int64
	// Writes is what the run adds to etcd's backend.
	Writes int64
	// StateDir, when set, is where a rollback of the run will keep its own
	// undo: a snapshot of the database after the run and a journal of the
	// values it puts back over (RollbackJournalBytes); that rollback adds
	// RollbackWrites to etcd's backend.
	StateDir                             undo.StateDir
	RollbackWrites, RollbackJournalBytes int64
	// Etcd is etcd's data directory on this host (its growth is not
	// counted when unknown).
	Etcd   EtcdData
	Status etcdscan.StatusInfo
	Quota  int64
}

// Needs are the files and growth of s, each on the filesystem it goes to.
func (s RunSpace) Needs() []DiskNeed {
	var needs []DiskNeed
	if s.Snapshot != "" {
		needs = append(needs, DiskNeed{What: "snapshot", Path: s.Snapshot, Bytes: s.Status.DBSize})
	}
	if s.Journal != "" {
		needs = append(needs, DiskNeed{What: "journal", Path: s.Journal, Bytes: s.JournalBytes})
	}
	db, wal := EtcdGrowth(s.Writes, s.Status, s.Quota)
	if s.Etcd.Dir != "" {
		needs = append(needs, etcdNeeds(s.Etcd.Dir, "the run", db, wal)...)
	}
	if s.StateDir != "" {
		j, snap := s.StateDir.NextRunFiles()
		after := s.Status
		after.DBSize += db
		after.Free = max(after.Free-s.Writes, 0)
		needs = append(needs,
			DiskNeed{What: "a rollback's own snapshot", Path: snap, Bytes: after.DBSize},
			DiskNeed{What: "a rollback's own journal", Path: j, Bytes: s.RollbackJournalBytes})
		if s.Etcd.Dir != "" {
			rdb, rwal := EtcdGrowth(s.RollbackWrites, after, s.Quota)
			needs = append(needs, etcdNeeds(s.Etcd.Dir, "the rollback", rdb, rwal)...)
		}
	}
	return needs
}

// etcdNeeds are etcd's growth in its data directory dir from whose writes.
func etcdNeeds(dir, whose string, db, wal int64) []DiskNeed {
	// CheckDiskSpace looks at the filesystem of a need's directory: the
	// data directory itself.
	path := filepath.Join(dir, "member")
	return []DiskNeed{
		{What: "etcd's database growth from " + whose, Path: path, Bytes: db, Etcd: true},
		{What: "etcd's WAL of " + whose, Path: path, Bytes: wal, Etcd: true},
	}
}

// PutCostSize is PutCost for a key and a value of these lengths.
func PutCostSize(keyLen, valueLen int) int64 { return putCostN(keyLen, valueLen) }

// EtcdDataOf is etcd's data directory as kube-apiserver's configuration
// carries it from the installer's layout (nothing when it does not).
func EtcdDataOf(api *apiserverconfig.Config) EtcdData {
	if api == nil || (api.EtcdDataDir == "" && api.EtcdDataDirFrom == "") {
		return EtcdData{}
	}
	return EtcdData{Dir: api.EtcdDataDir, Source: api.EtcdDataDirFrom}
}
