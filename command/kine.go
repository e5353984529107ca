package command

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/installer"
	"kube-etcd-migrate/kinedb"
)

// kineStore is a datastore served through kine: k3s's or RKE2's SQLite
// file (db), or its PostgreSQL or MySQL database (dsn, with the TLS files kine
// connects with), or a SQLite backup given as the snapshot file
// (installer "").
type kineStore struct {
	installer          string
	db                 string
	dsn, ca, cert, key string
	// name is what messages call it: the file, or the database and its
	// host (never the DSN: it holds the password).
	name string
}

// kind is the database's kind, for messages.
func (k *kineStore) kind() string {
	if k.dsn != "" {
		return installer.DatastoreKind(k.dsn)
	}
	return "SQLite"
}

// dump is the dump of a database server's datastore its operator takes
// before a writing run (its undo beyond the journal): pg_dump or
// mysqldump.
func (k *kineStore) dump() string {
	if k.kind() == "MySQL" {
		return "mysqldump"
	}
	return "pg_dump"
}

// kineStore is the datastore the node's k3s or RKE2 keeps the cluster in
// through kine, when that is what was found and --endpoints does not name
// the cluster instead (nil otherwise).
func (o *apiServerOptions) kineStore(prov provenance) *kineStore {
	if prov.onCommandLine("endpoints") {
		return nil
	}
	d := o.found
	if d == nil || d.found == nil || !d.found.OnKine() {
		return nil
	}
	f := d.found
	if f.KineDSN != "" {
		return &kineStore{installer: string(f.Installer), dsn: f.KineDSN, ca: f.KineCAFile, cert: f.KineCertFile, key: f.KineKeyFile, name: "the " + installer.ServerDatabase(f.KineDSN)}
	}
	return &kineStore{installer: string(f.Installer), db: f.KineDatabase, name: f.KineDatabase}
}

// kineServed is a datastore the command serves through kine: the server
// and its private directory.
type kineServed struct {
	srv *kinedb.Server
	dir string
	// store is the node's datastore (srv serves it, or a SQLite file's copy).
	store *kineStore
	// write: the node's datastore itself is served, for a writing run.
	write bool
}

// writing is the datastore a writing run writes (writerun.Config.Kine):
// nil when none is served, or only its copy.
func (k *kineServed) writing() *kinedb.Server {
	if k == nil || !k.write {
		return nil
	}
	return k.srv
}

func (k *kineServed) close() {
	if k == nil {
		return
	}
	if k.srv != nil {
		k.srv.Close()
	}
	os.RemoveAll(k.dir)
	kineDirs.Delete(k.dir)
}

// kineDirs are the private directories of the datastores served, their
// copies in them (the cluster's values: its Secrets, encrypted or not):
// removeKineDirs removes them for a process about to exit without running
// its deferred calls (a second SIGINT).
var kineDirs sync.Map

func removeKineDirs() {
	kineDirs.Range(func(d, _ any) bool {
		_ = os.RemoveAll(d.(string))
		return true
	})
}

// kineReaders are the commands that read a datastore served through kine
// (a copy of it); kineWriters those that also write it (the node's file
// itself, in a writing run: writerun.Config.Kine). The others are refused
// (kineRefusal).
var (
	kineReaders = []string{"verify", "inventory", "inspect", "plan", "migrate", "rollback", "quarantine", "restore"}
	kineWriters = []string{"migrate", "rollback", "quarantine", "restore"}
)

// kineRefusal is the error of a command this release does not run on a
// datastore served through kine.
func kineRefusal(command string, k *kineStore) error {
	if k.installer == "" {
		return fmt.Errorf("%s of %s, a SQLite database (k3s's or RKE2's datastore through kine), is not supported: a backup is read (verify, inventory, inspect), never written; restore it in place of the node's datastore (k3s stopped) and migrate that (docs/configuration.md#k3s-and-rke2-on-sqlite)", command, k.name)
	}
	return fmt.Errorf("%s on %s's %s datastore (%s) is not supported by this release: it reads it (verify, inventory, inspect, plan) and writes it with migrate, rollback, quarantine and restore (docs/configuration.md#k3s-and-rke2-on-sqlite)", command, k.installer, k.kind(), k.name)
}

// serveKine serves the datastore st through kine for command and points
// cfg at it. A SQLite file: for a command that only reads, a copy, in a
// private directory under $TMPDIR, so that neither the tool nor kine
// changes the node's file; for one that writes it (write), the file
// itself, under kinedb's lock. A PostgreSQL or MySQL database: the database itself,
// read without a write of kine's own (kinedb), or written under kinedb's
// lock. st's installer is "" for a file given with --snapshot-file (a
// backup, never written).
func serveKine(ctx context.Context, w io.Writer, command string, st *kineStore, write bool, cfg *etcdscan.Config) (*kineServed, error) {
	if !slices.Contains(kineReaders, command) || (write && (st.installer == "" || !slices.Contains(kineWriters, command))) {
		return nil, kineRefusal(command, st)
	}
	dir, err := os.MkdirTemp("", "kube-etcd-migrate-kine-")
	if err != nil {
		return nil, fmt.Errorf("serving %s through kine: %w", st.name, err)
	}
	kineDirs.Store(dir, true)
	k := &kineServed{dir: dir}
	kcfg := kinedb.Config{Database: st.db, DSN: st.dsn, CAFile: st.ca, CertFile: st.cert, KeyFile: st.key, Dir: dir, ReadOnly: !write}
	k.srv, err = kinedb.Serve(ctx, kcfg)
	if err != nil {
		k.close()
		return nil, err
	}
	k.write, k.store = write, st
	what := st.installer + "'s " + st.kind() + " datastore"
	if st.installer == "" {
		what = "the SQLite database"
	}
	switch {
	case write && st.dsn != "":
		fmt.Fprintf(w, "note: writing %s, %s, through kine %s in this process (socket in %s; the database locked for this run, no other client connected to it)\n", what, st.name, kinedb.KineVersion, dir)
	case write:
		fmt.Fprintf(w, "note: writing %s %s through kine %s in this process (socket in %s; the file locked, no other process holding it)\n", what, st.name, kinedb.KineVersion, dir)
	case st.dsn != "":
		fmt.Fprintf(w, "note: reading %s, %s, through kine %s in this process (socket in %s; nothing is written to it)\n", what, st.name, kinedb.KineVersion, dir)
	default:
		fmt.Fprintf(w, "note: reading %s %s through kine %s, from a copy in %s (nothing is written to %s)\n", what, st.name, kinedb.KineVersion, dir, st.name)
	}
	cfg.Endpoints = []string{k.srv.Endpoint}
	cfg.CACert, cfg.Cert, cfg.Key = "", "", ""
	return k, nil
}

// kineFlags refuses, on a datastore served through kine (k non-nil), the
// flags a writing run there does not have: storage version migration
// requests and records (their writer and snapshot are etcd's), and
// --compact-history (kine compacts on its own schedule, in k3s).
func kineFlags(k *kineServed, requested, record, compact bool) error {
	if k == nil {
		return nil
	}
	for _, f := range []struct {
		on   bool
		flag string
	}{{requested, "--requested"}, {record, "--record"}, {compact, "--compact-history"}} {
		if f.on {
			return usageErr("%s: not supported on a %s datastore served through kine (%s); nothing was written", f.flag, k.store.kind(), k.store.name)
		}
	}
	return nil
}
