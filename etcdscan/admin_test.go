package etcdscan

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
)

func TestStatusSnapshotCompactRevision(t *testing.T) {
	testetcd.Each(t, testStatusSnapshotCompactRevision)
}

func testStatusSnapshotCompactRevision(t *testing.T, version string) {
	s, c := startClient(t, testetcd.Options{Version: version})
	ctx := context.Background()
	putKeys(t, c, "/registry/pods/", 50)

	st, err := Status(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if st.DBSize <= 0 || st.DBSizeInUse <= 0 || st.DBSizeInUse > st.DBSize || st.Leader == 0 || st.Version != s.Version {
		t.Fatalf("status %+v (server version %s)", st, s.Version)
	}
	alarms, err := Alarms(ctx, c)
	if err != nil || len(alarms) != 0 {
		t.Fatalf("alarms on a healthy server: %v %v", alarms, err)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "before-migrate.db")
	if err := Snapshot(ctx, c, path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() < 4096 || fi.Mode().Perm() != 0o600 {
		t.Fatalf("snapshot file: %d bytes, mode %v", fi.Size(), fi.Mode().Perm())
	}
	// The snapshot is a bbolt database holding every revision written so far.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("snapshot is not a bbolt database: %v", err)
	}
	revs := 0
	if err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("key"))
		if b == nil {
			return errors.New("no key bucket")
		}
		revs = b.Stats().KeyN
		return nil
	}); err != nil || revs < 50 {
		t.Fatalf("snapshot holds %d revisions (%v), want >= 50", revs, err)
	}
	db.Close()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("snapshot left temporary files: %v", entries)
	}

	// A part file left by an interrupted save, readable by all: the new snapshot
	// is never written into it with that mode, and it is gone afterwards.
	again := filepath.Join(dir, "again.db")
	if err := os.WriteFile(again+".part", []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Snapshot(ctx, c, again); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(again); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 4096 {
		t.Fatalf("snapshot over a leftover part file: %v %v", fi, err)
	}
	if _, err := os.Stat(again + ".part"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("part file left: %v", err)
	}
	// An impossible path: the error names it, nothing is created.
	missing := filepath.Join(dir, "no-such-dir", "x.db")
	if err := Snapshot(ctx, c, missing); err == nil || !strings.Contains(err.Error(), missing) || strings.Count(err.Error(), "\n") != 0 {
		t.Fatalf("snapshot into a missing directory: %v", err)
	}

	if rev, err := CompactRevision(ctx, c); err != nil || rev != 0 {
		t.Fatalf("never compacted: %d %v", rev, err)
	}
	cur, err := s.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx, cur-17); err != nil {
		t.Fatal(err)
	}
	putKeys(t, c, "/registry/more/", 3)
	if rev, err := CompactRevision(ctx, c); err != nil || rev != cur-17 {
		t.Fatalf("compacted at %d: got %d %v", cur-17, rev, err)
	}
}

// TestSnapshotTLSAndAuth: the snapshot is taken with the TLS material and the
// credentials the client was connected with (etcd's snapshot package opens its
// own client to the member).
func TestSnapshotTLSAndAuth(t *testing.T) { testetcd.Each(t, testSnapshotTLSAndAuth) }

func testSnapshotTLSAndAuth(t *testing.T, version string) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	srvCert, srvKey := ca.Issue(t, dir, "server", true)
	cliCert, cliKey := ca.Issue(t, dir, "client", false)
	s := testetcd.StartT(t, testetcd.Options{Version: version, TLS: &testetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.File}})
	ctx := context.Background()
	cfg := Config{Endpoints: []string{s.Endpoint}, CACert: ca.File, Cert: cliCert, Key: cliKey, DialTimeout: 3 * time.Second, CommandTimeout: 5 * time.Second}
	admin, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func() error{
		func() error { _, err := admin.UserAdd(ctx, "root", "s3cret"); return err },
		func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := admin.AuthEnable(ctx); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	admin.Close()
	cfg.Username, cfg.Password = "root", "s3cret"
	c, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	path := filepath.Join(dir, "tls.db")
	if err := Snapshot(ctx, c, path); err != nil {
		t.Fatalf("snapshot over TLS with auth: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 4096 {
		t.Fatalf("snapshot file %v %v", fi, err)
	}

	// The quota is read over the same TLS (client certificate required).
	if qs, err := Quotas(ctx, c); err != nil || len(qs) != 1 || qs[0].Bytes != 2<<30 || !strings.HasPrefix(qs[0].URL, "https://") {
		t.Fatalf("quotas over TLS: %+v %v", qs, err)
	}

	// A user who may only read: the writer stops at the first refusal, sends
	// nothing more, and every put says why.
	for _, step := range []func() error{
		func() error { _, err := c.RoleAdd(ctx, "reader"); return err },
		func() error {
			_, err := c.RoleGrantPermission(ctx, "reader", "/registry/", clientv3.GetPrefixRangeEnd("/registry/"), clientv3.PermissionType(clientv3.PermRead))
			return err
		},
		func() error { _, err := c.UserAdd(ctx, "reader", "pw"); return err },
		func() error { _, err := c.UserGrantRole(ctx, "reader", "reader"); return err },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Username, cfg.Password = "reader", "pw"
	rc, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	w := &Writer{Client: rc}
	puts := make([]Put, 40)
	for i := range puts {
		puts[i] = Put{Key: fmt.Sprintf("/registry/ro/%d", i), Value: []byte("v")}
	}
	for i, r := range w.Write(ctx, puts) {
		if fe := AsFatal(r.Err); r.Status != Failed || fe == nil || fe.Cause != CausePermission {
			t.Fatalf("put %d as a reader: %v %v", i, r.Status, r.Err)
		}
	}
	if st := w.Stats(); w.Stopped() == nil || st.Singles != 0 || st.Splits != 0 || st.Retries != 0 {
		t.Fatalf("stopped %v, stats %+v", w.Stopped(), st)
	}
}

func TestAlarmsNoSpace(t *testing.T) { testetcd.Each(t, testAlarmsNoSpace) }

func testAlarmsNoSpace(t *testing.T, version string) {
	_, c := startClient(t, testetcd.Options{Version: version, QuotaBackendBytes: 2 << 20})
	ctx := context.Background()
	big := strings.Repeat("x", 128<<10)
	var err error
	for i := 0; i < 200 && err == nil; i++ {
		_, err = c.Put(ctx, fmt.Sprintf("/registry/big/%d", i), big)
	}
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("filling a 2 MiB quota: %v", err)
	}
	alarms, err := Alarms(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if len(alarms) != 1 || !strings.HasPrefix(alarms[0], "NOSPACE on member ") {
		t.Fatalf("alarms %q", alarms)
	}

	// The quota, as the member's own metrics say it.
	qs, err := Quotas(ctx, c)
	if err != nil || len(qs) != 1 || qs[0].Bytes != 2<<20 {
		t.Fatalf("quotas %+v %v", qs, err)
	}
	st, err := Status(ctx, c)
	if err != nil || len(st.Members) != 1 || st.DBSize == 0 || st.Revision == 0 {
		t.Fatalf("status %+v %v", st, err)
	}

	// Under the alarm the writer stops at the first refusal: 40 puts (three
	// transactions) send one request, no split, no key by key, and every put
	// says why.
	txnsBefore := txnRequests(t, qs[0].URL)
	w := &Writer{Client: c}
	puts := make([]Put, 40)
	for i := range puts {
		puts[i] = Put{Key: fmt.Sprintf("/registry/big/%d", i), Value: []byte("small"), ModRevision: 1}
	}
	for i, r := range w.Write(ctx, puts) {
		fe := AsFatal(r.Err)
		if r.Status != Failed || fe == nil || fe.Cause != CauseNoSpace || !strings.Contains(r.Err.Error(), puts[i].Key) {
			t.Fatalf("put %d: %v %v", i, r.Status, r.Err)
		}
	}
	if w.Stopped() == nil || w.Stats().Splits != 0 || w.Stats().Singles != 0 {
		t.Fatalf("stopped %v, stats %+v", w.Stopped(), w.Stats())
	}
	if n := txnRequests(t, qs[0].URL) - txnsBefore; n != 1 {
		t.Fatalf("%d Txn requests reached etcd after the alarm, want 1", n)
	}
}

// txnRequests is the member's count of Txn requests handled, from its metrics.
func txnRequests(t *testing.T, metricsURL string) int {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "grpc_server_handled_total{") && strings.Contains(line, `grpc_method="Txn"`) {
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatal(err)
			}
			n += int(v)
		}
	}
	return n
}
