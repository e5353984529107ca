package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/kinedb"
)

// TestSQLiteSignals: SIGINT while verify reads a SQLite datastore's copy
// (a backup given as --snapshot-file), once (it stops) or twice (it exits
// at once), leaves nothing in $TMPDIR — the copy holds the cluster's
// values — and the backup unchanged.
func TestSQLiteSignals(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	db := filepath.Join(dir, "state.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s")
	if err := os.Mkdir(sock, 0o700); err != nil {
		t.Fatal(err)
	}
	s, err := kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: sock})
	if err != nil {
		t.Fatal(err)
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20000 {
		if _, err := c.Put(ctx, fmt.Sprintf("/registry/configmaps/default/cm-%05d", i), strings.Repeat("v", 500)); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	s.Close()
	backup := filepath.Join(dir, "backup.db")
	if err := kinedb.Copy(ctx, db, backup); err != nil {
		t.Fatal(err)
	}
	before := sum256(t, backup)
	bin := toolBinary(t)
	for _, signals := range []int{1, 2} {
		tmp := t.TempDir()
		cmd := exec.Command(bin, "verify", "--snapshot-file", backup)
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		stderr := &lockedBuffer{}
		code := runInterrupted(t, cmd, stderr, "through kine", signals, 5*time.Millisecond)
		t.Logf("%d signal(s): exit %d", signals, code)
		// 1 (interrupted), 130 (second signal); 0, 3 or 4 if it finished first.
		if code != 1 && code != exitSignal && code != 0 && code != 3 && code != 4 {
			t.Errorf("%d signal(s): exit %d, stderr %q", signals, code, stderr.String())
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("%d signal(s), exit %d: left in $TMPDIR: %v (stderr %s)", signals, code, left, stderr.String())
		}
	}
	if sum256(t, backup) != before {
		t.Error("the backup changed")
	}

	// Which of the ways out a run takes depends on when the signals land;
	// the one that skips the deferred calls (os.Exit at the second) removes
	// the copy through removeKineDirs.
	t.Setenv("TMPDIR", t.TempDir())
	cfg, err := etcdOptions{}.config()
	if err != nil {
		t.Fatal(err)
	}
	k, err := serveKine(ctx, io.Discard, "verify", "", backup, false, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	removeKineDirs()
	if _, err := os.Stat(k.dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("removeKineDirs left %s: %v", k.dir, err)
	}
	k.close()
}
