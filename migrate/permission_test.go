package migrate

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kube-etcd-migrate/etcdscan"
)

// TestPermissionRevokedMidRun: the run's etcd user loses its write
// permission half way (an operator's role change, a revoked grant): the run
// stops at the first refusal with one line naming the key, the journal and
// the remedy, writes nothing more, its journal lists exactly what it wrote,
// and once the permission is back the rollback restores every value byte for
// byte.
func TestPermissionRevokedMidRun(t *testing.T) {
	s := seedSpace(t, 0)
	ctx := context.Background()
	root := s.c.Cli
	prefixEnd := clientv3.GetPrefixRangeEnd("/registry/")
	for _, step := range []func() error{
		func() error { _, err := root.RoleAdd(ctx, "root"); return err },
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "migrator"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "migrator", "/registry/", prefixEnd, clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "migrator", "pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "migrator", "migrator"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	client := func(user, pw string) *clientv3.Client {
		t.Helper()
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.c.Srv.URL}, Username: user, Password: pw, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	admin := client("root", "rootpw")
	s.c.Cli = client("migrator", "pw")
	env := s.env()
	journal := filepath.Join(s.c.Dir, "journal")
	const batch = 16

	var revokeErr error
	revoked := false
	opts := Options{Journal: journal, Writers: 1, BatchOps: batch, Progress: func(n Counts) {
		if revoked || n.Scanned < 200 {
			return
		}
		revoked = true
		if _, revokeErr = admin.RoleRevokePermission(ctx, "migrator", "/registry/", prefixEnd); revokeErr == nil {
			_, revokeErr = admin.RoleGrantPermission(ctx, "migrator", "/registry/", prefixEnd, clientv3.PermissionType(clientv3.PermRead))
		}
	}}
	sum, err := Run(ctx, env, opts)
	if revokeErr != nil {
		t.Fatal(revokeErr)
	}
	if !revoked {
		t.Fatal("the run ended before the permission was revoked")
	}
	var stop *StopError
	if !errors.As(err, &stop) || stop.Fatal.Cause != etcdscan.CausePermission {
		t.Fatalf("err = %v, want permission denied", err)
	}
	msg := err.Error()
	t.Logf("%s", msg)
	for _, want := range []string{"permission denied", stop.Key, journal, "--user"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("not one line: %q", msg)
	}
	if sum.Summary.Failed == 0 || sum.Summary.Failed > batch {
		t.Fatalf("failed %d writes: want at most one batch (%d) after the refusal", sum.Summary.Failed, batch)
	}
	if sum.Summary.Rewritten == 0 || sum.Summary.Rewritten+sum.Summary.Failed >= spaceSecrets {
		t.Fatalf("the run did not stop mid-way: %+v", sum.Summary)
	}
	if len(sum.Causes) != 1 || sum.Causes[0].Cause != etcdscan.CausePermission || sum.Causes[0].Count != sum.Summary.Failed {
		t.Fatalf("causes %+v", sum.Causes)
	}
	if done := journalDone(t, journal); int64(done) != sum.Summary.Rewritten {
		t.Fatalf("journal: %d done records, %d rewritten", done, sum.Summary.Rewritten)
	}
	// What etcd holds is what the journal says: every key rewritten or
	// untouched, none written after the stop.
	changed := 0
	for key, want := range s.values {
		resp, err := admin.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("%s: %v", key, err)
		}
		if !bytes.Equal(resp.Kvs[0].Value, want) {
			changed++
		}
	}
	if int64(changed) != sum.Summary.Rewritten {
		t.Fatalf("%d keys changed in etcd, the run says %d rewritten", changed, sum.Summary.Rewritten)
	}

	// Still read-only: the rollback is refused the same way and writes nothing.
	if _, err := Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("rollback as a reader: %v", err)
	}
	// The remedy: the write permission back; the rollback restores every value.
	if _, err := admin.RoleGrantPermission(ctx, "migrator", "/registry/", prefixEnd, clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	res, err := Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli})
	if err != nil || res.Failed != 0 || int64(res.Restored) != sum.Summary.Rewritten {
		t.Fatalf("rollback after the remedy: %+v %v", res, err)
	}
	for key, want := range s.values {
		resp, err := admin.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 || !bytes.Equal(resp.Kvs[0].Value, want) {
			t.Fatalf("%s: not restored byte for byte (%v)", key, err)
		}
	}
}
