package migrate

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/rollback"
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
	const batch = 16
	sum, journal, err := s.runInterrupted(t, batch, func() error {
		if _, err := admin.RoleRevokePermission(ctx, "migrator", "/registry/", prefixEnd); err != nil {
			return err
		}
		_, err := admin.RoleGrantPermission(ctx, "migrator", "/registry/", prefixEnd, clientv3.PermissionType(clientv3.PermRead))
		return err
	})
	stoppedMidRun(t, sum, err, etcdscan.CausePermission, batch, journal, "permission denied", string(input.User))
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
	if _, err := rollback.Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("rollback as a reader: %v", err)
	}
	// The remedy: the write permission back; the rollback restores every value.
	if _, err := admin.RoleGrantPermission(ctx, "migrator", "/registry/", prefixEnd, clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	res, err := rollback.Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli})
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
