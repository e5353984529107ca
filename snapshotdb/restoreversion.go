package snapshotdb

import (
	"fmt"
	"os"

	"github.com/coreos/go-semver/semver"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.uber.org/zap"
)

// noWAL is the WAL of a snapshot file: it has none (a restore writes a new
// one), so no WAL entry stands in the way of a lower storage version.
type noWAL struct{}

func (noWAL) MinimalEtcdVersion() *semver.Version { return nil }

// keepVersions gives the snapshot at path (with etcd's sha256 trailer) the
// storage and cluster versions of the input, want, where they are lower
// than the file's. The private etcd is the linked release (3.7), which
// raises both to its own when it starts; etcd 3.6 refuses to start on a
// data directory restored from such a file ("Failed to validate schema:
// version 3.7.0 is not supported", then "invalid downgrade; server version
// is lower than determined cluster version"). The schema is migrated down
// with etcd's own migration (what `etcdutl migrate --target-version` does to
// a data directory), the cluster version saved with etcd's membership
// store, and the trailer written again. The input of an etcd 3.5 cluster
// records no storage version: the file is given the 3.5 schema.
func keepVersions(path string, want Versions) error {
	var storage, cluster *semver.Version
	for _, v := range []struct {
		s   string
		dst **semver.Version
	}{{want.Storage, &storage}, {want.Cluster, &cluster}} {
		if v.s == "" {
			continue
		}
		p, err := semver.NewVersion(v.s)
		if err != nil {
			return fmt.Errorf("version %q of the input: %w", v.s, err)
		}
		*v.dst = p
	}
	if storage == nil && cluster != nil && cluster.LessThan(semver.Version{Major: 3, Minor: 6}) {
		// etcd 3.5 records no storage version: its schema is the cluster's
		// (etcd's migration to 3.5 removes the field again).
		storage = &semver.Version{Major: cluster.Major, Minor: cluster.Minor}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !HasTrailer(fi.Size()) {
		return fmt.Errorf("the snapshot etcd sent has no sha256 trailer (%d bytes)", fi.Size())
	}
	have, err := versionsOf(path)
	if err != nil {
		return err
	}
	lower := func(want *semver.Version, have string) bool {
		h, err := semver.NewVersion(have)
		return want != nil && err == nil && want.LessThan(*h)
	}
	downStorage, downCluster := lower(storage, have.Storage), lower(cluster, have.Cluster)
	if !downStorage && !downCluster {
		return nil
	}
	if err := os.Truncate(path, fi.Size()-TrailerSize); err != nil {
		return err
	}
	lg := zap.NewNop()
	be := backend.NewDefaultBackend(lg, path)
	if downCluster {
		schema.NewMembershipBackend(lg, be).MustSaveClusterVersionToBackend(cluster)
	}
	if downStorage {
		err = schema.Migrate(lg, be.BatchTx(), noWAL{}, *storage)
	}
	be.ForceCommit()
	if cerr := be.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("storage version %s -> %s: %w", have.Storage, storage, err)
	}
	return AppendTrailer(path)
}

// versionsOf reads the versions a database file records.
func versionsOf(path string) (Versions, error) {
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		return Versions{}, err
	}
	defer db.Close()
	var v Versions
	err = db.View(func(tx *bolt.Tx) error {
		v = ReadVersions(tx)
		return nil
	})
	return v, err
}
