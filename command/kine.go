package command

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/kinedb"
)

// kineDatabase is the SQLite file the node's k3s or RKE2 keeps the cluster
// in through kine, when that is what was found and --endpoints does not
// name the cluster instead ("" otherwise), with the installer's name.
func (o *apiServerOptions) kineDatabase(prov provenance) (db, installer string) {
	if prov.onCommandLine("endpoints") {
		return "", ""
	}
	if d := o.found; d != nil && d.found != nil && d.found.KineDatabase != "" {
		return d.found.KineDatabase, string(d.found.Installer)
	}
	return "", ""
}

// kineServed is a datastore the command serves through kine: the server
// and its private directory.
type kineServed struct {
	srv *kinedb.Server
	dir string
	// db is the node's database file (srv serves it or its copy).
	db string
	// write: the node's file itself is served, for a writing run.
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
func kineRefusal(command, installer, db string) error {
	if installer == "" {
		return fmt.Errorf("%s of %s, a SQLite database (k3s's or RKE2's datastore through kine), is not supported: a backup is read (verify, inventory, inspect), never written; restore it in place of the node's datastore (k3s stopped) and migrate that (docs/configuration.md#k3s-and-rke2-on-sqlite)", command, db)
	}
	return fmt.Errorf("%s on %s's SQLite datastore (%s, through kine) is not supported by this release: it reads it (verify, inventory, inspect, plan) and writes it with migrate, rollback, quarantine and restore (docs/configuration.md#k3s-and-rke2-on-sqlite)", command, installer, db)
}

// serveKine serves the SQLite datastore db through kine for command and
// points cfg at it: for a command that only reads, a copy, in a private
// directory under $TMPDIR, so that neither the tool nor kine changes the
// node's file; for one that writes it (write), the file itself, under
// kinedb's lock. installer is whose datastore it is, "" for a file given
// with --snapshot-file (a backup, never written).
func serveKine(ctx context.Context, w io.Writer, command, installer, db string, write bool, cfg *etcdscan.Config) (*kineServed, error) {
	if !slices.Contains(kineReaders, command) || (write && (installer == "" || !slices.Contains(kineWriters, command))) {
		return nil, kineRefusal(command, installer, db)
	}
	dir, err := os.MkdirTemp("", "kube-etcd-migrate-kine-")
	if err != nil {
		return nil, fmt.Errorf("serving %s through kine: %w", db, err)
	}
	kineDirs.Store(dir, true)
	k := &kineServed{dir: dir}
	k.srv, err = kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: dir, ReadOnly: !write})
	if err != nil {
		k.close()
		return nil, err
	}
	k.write, k.db = write, db
	what := installer + "'s SQLite datastore"
	if installer == "" {
		what = "the SQLite database"
	}
	if write {
		fmt.Fprintf(w, "note: writing %s %s through kine %s in this process (socket in %s; the file locked, no other process holding it)\n", what, db, kinedb.KineVersion, dir)
	} else {
		fmt.Fprintf(w, "note: reading %s %s through kine %s, from a copy in %s (nothing is written to %s)\n", what, db, kinedb.KineVersion, dir, db)
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
			return usageErr("%s: not supported on a SQLite datastore served through kine (%s); nothing was written", f.flag, k.db)
		}
	}
	return nil
}
