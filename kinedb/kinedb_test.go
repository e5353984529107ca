package kinedb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func client(t *testing.T, s *Server) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A datastore served writable keeps what is written; served read-only, the
// node's file is not changed by what is written through kine.
func TestServe(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "state.db")
	// A missing file is refused (kine would make a new, empty datastore).
	_, err := Serve(ctx, Config{Database: db, Dir: mkdir(t, dir, "w")})
	var nf *NotFoundError
	if !errors.As(err, &nf) || !strings.Contains(err.Error(), db) {
		t.Fatalf("a missing database: %v; want a NotFoundError naming it", err)
	}
	if _, err := os.Stat(db); err == nil {
		t.Fatal("serving a missing database made it")
	}
	// An empty file: kine makes its table in it, as k3s's first start does.
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Serve(ctx, Config{Database: db, Dir: mkdir(t, dir, "w2")})
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, s)
	if _, err := c.Put(ctx, "/registry/secrets/default/a", "one"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	before, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}

	if !IsSQLite(db) {
		t.Error("IsSQLite: false for kine's database")
	}
	if IsSQLite(filepath.Join(dir, "none")) || IsSQLite("") {
		t.Error("IsSQLite: true for a file that does not exist")
	}
	ro, err := Serve(ctx, Config{Database: db, Dir: mkdir(t, dir, "r"), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if !ro.Private || ro.Copied <= 0 || ro.Database == db || filepath.Dir(ro.Database) != filepath.Join(dir, "r") {
		t.Errorf("a read-only serve: Private %v, Copied %v, Database %s; want its copy in its directory, timed", ro.Private, ro.Copied, ro.Database)
	}
	if s.Private || s.Copied != 0 {
		t.Errorf("a writable serve: Private %v, Copied %v; want the node's file, no copy", s.Private, s.Copied)
	}
	c = client(t, ro)
	resp, err := c.Get(ctx, "/registry/secrets/default/a")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "one" {
		t.Fatalf("read through kine: %v", resp.Kvs)
	}
	if _, err := c.Put(ctx, "/registry/secrets/default/b", "two"); err != nil {
		t.Fatal(err)
	}
	ro.Close()
	after, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Fatal("serving a copy changed the database")
	}
}

// A database another process holds open is refused, naming the process.
func TestHeldOpen(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "state.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	cmd.ExtraFiles = []*os.File{f} // its descriptor 3
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		h, err := Holders(db)
		if err != nil {
			t.Fatal(err)
		}
		if len(h) == 1 && h[0].PID == cmd.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holders: %v", h)
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err = Serve(context.Background(), Config{Database: db, Dir: mkdir(t, dir, "s")})
	if err == nil || !strings.Contains(err.Error(), "sleep") || !strings.Contains(err.Error(), db) {
		t.Fatalf("served a held database, or the error names neither file nor process: %v", err)
	}
}

func mkdir(t *testing.T, dir, name string) string {
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDamaged: a damaged or foreign SQLite file is refused with one line
// naming it (or served and read without a panic): cut short, bytes flipped
// across its pages, another program's database, not SQLite at all.
func TestDamaged(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.db")
	if err := os.WriteFile(good, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Serve(ctx, Config{Database: good, Dir: mkdir(t, dir, "g")})
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, s)
	for i := range 200 {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/configmaps/default/cm-%03d", i), strings.Repeat("v", 3000)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	s.Close()
	// The write-ahead log into the file, as k3s leaves it when it stops.
	if err := Copy(ctx, good, filepath.Join(dir, "whole.db")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "whole.db"))
	if err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), b...)
	for i := 4096; i < len(flipped); i += 997 {
		flipped[i] ^= 0x5a
	}
	other := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite", other)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes(body) VALUES ('x')"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	cases := map[string][]byte{
		"truncated.db": b[:len(b)/2],
		"flipped.db":   flipped,
		"garbage.db":   []byte(strings.Repeat("not a database ", 1000)),
	}
	for name, content := range cases {
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"truncated.db", "flipped.db", "garbage.db", "other.db"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name)
			s, err := Serve(ctx, Config{Database: path, Dir: mkdir(t, t.TempDir(), "s"), ReadOnly: true})
			if err != nil {
				t.Log(err)
				if !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "\n") {
					t.Errorf("error not one line naming the file: %q", err)
				}
				return
			}
			if name == "other.db" {
				t.Fatal("another program's database served as a datastore")
			}
			defer s.Close()
			// Served: reading it answers or fails, without a panic.
			c := client(t, s)
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err = c.Get(rctx, "/registry/", clientv3.WithPrefix())
			t.Logf("served; a read: %v", err)
		})
	}
}

// A copy read is served with kine's backend not started: a key whose lease
// ran out is still there (kine's TTL expiry, which holds every leased key
// in the process to delete them, is not running), and a watch is refused,
// not served from a backend that was never started.
func TestReadOnlyNotStarted(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "state.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := Serve(ctx, Config{Database: db, Dir: mkdir(t, dir, "w")})
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, w)
	lease, err := c.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	const key = "/registry/events/default/e"
	if resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "event", clientv3.WithLease(lease.ID))).Commit(); err != nil || !resp.Succeeded {
		t.Fatalf("create %s: %v", key, err)
	}
	w.Close()
	time.Sleep(2500 * time.Millisecond) // the event's lease (1 s) runs out

	ro, err := Serve(ctx, Config{Database: db, Dir: mkdir(t, dir, "r"), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	c = client(t, ro)
	time.Sleep(500 * time.Millisecond) // kine's TTL expiry, were it running, deletes it at once
	resp, err := c.Get(ctx, key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the expired event in the copy: %v %v; want it kept (kine's TTL expiry not running)", resp, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	select {
	case wr, ok := <-c.Watch(wctx, "/registry/", clientv3.WithPrefix()):
		if ok && wr.Err() == nil {
			t.Fatalf("watch of a copy: %+v; want it refused", wr)
		}
	case <-wctx.Done():
		t.Fatal("watch of a copy: no answer")
	}
}
