package guard

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// TestFindQuotaSources: over TLS the quota comes from the member's own
// metrics; when those cannot be read (here: a client made without the
// tool's connection settings, so the metrics request has no certificate),
// from --quota-backend-bytes, else etcd's manifest beside kube-apiserver's,
// else it is unknown and said so, with etcd's default assumed.
func TestFindQuotaSources(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	srvCert, srvKey := ca.Issue(t, dir, "server", true)
	cliCert, cliKey := ca.Issue(t, dir, "client", false)
	s := testetcd.StartT(t, testetcd.Options{QuotaBackendBytes: 64 << 20, TLS: &testetcd.TLSFiles{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: ca.File}})
	ctx := context.Background()
	cli, err := etcdscan.Connect(ctx, etcdscan.Config{Endpoints: []string{s.Endpoint}, CACert: ca.File, Cert: cliCert, Key: cliKey, DialTimeout: 3 * time.Second, CommandTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if q := FindQuota(ctx, cli, "", 0, testFlags); q.Bytes != 64<<20 || !q.Known || !strings.Contains(q.Source, "https://") {
		t.Fatalf("over TLS: %+v", q)
	}

	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(ca.File)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	other, err := clientv3.New(clientv3.Config{Endpoints: []string{s.URL}, DialTimeout: 3 * time.Second,
		TLS: &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	if q := FindQuota(ctx, other, "", 3<<20, testFlags); q.Bytes != 3<<20 || !q.Known || !strings.HasPrefix(q.Source, "--quota-backend-bytes (etcd's metrics did not answer") {
		t.Fatalf("told, metrics unreadable: %+v", q)
	}
	manifests := filepath.Join(dir, "manifests")
	if err := os.MkdirAll(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	apiserver := filepath.Join(dir, "kube-apiserver.yaml") // moved up out of manifests/ to stop it
	q := FindQuota(ctx, other, apiserver, 0, testFlags)
	if q.Known || q.Bytes != DefaultQuotaBackendBytes || !strings.HasPrefix(q.Source, "unknown (") || !strings.Contains(q.Source, "no etcd static-pod manifest") || !strings.Contains(q.Source, "no --quota-backend-bytes") {
		t.Fatalf("nothing to go by: %+v", q)
	}
	etcdPod := "apiVersion: v1\nkind: Pod\nmetadata: {name: etcd, namespace: kube-system}\nspec:\n  containers:\n  - name: etcd\n    image: etcd\n    command: [etcd, --quota-backend-bytes=3221225472]\n"
	if err := os.WriteFile(filepath.Join(manifests, "etcd.yaml"), []byte(etcdPod), 0o600); err != nil {
		t.Fatal(err)
	}
	if q := FindQuota(ctx, other, apiserver, 0, testFlags); q.Bytes != 3<<30 || !q.Known || !strings.Contains(q.Source, filepath.Join(manifests, "etcd.yaml")) {
		t.Fatalf("from etcd's manifest: %+v", q)
	}
}

// TestCompactingRollbackCountsWhatItPutsBack: right after a migrate
// --compact-history, etcd's pages in use still hold the history of the
// migration's last writes and the pages its last compaction freed (etcd counts
// them free only after commits with writes in them). A rollback with
// --compact-history compacts that history away, and what it puts back is
// what the migration replaced: the preflight counts that much of the pages in
// use as history, so it does not refuse the undo when it is most needed (the
// figures are those of a refusal TestRollbackKeepsBelowQuota met before: 3.3
// MiB in use in a 4.5 MiB quota, 2.3 MiB to put back). When the pages in use
// leave no room even so, it still refuses, naming the remedy.
func TestCompactingRollbackCountsWhatItPutsBack(t *testing.T) {
	q := Quota{Bytes: 4<<20 + 512<<10, Known: true, Source: "a test"}
	st := etcdscan.StatusInfo{DBSize: 3<<20 + 700<<10, DBSizeInUse: 3<<20 + 300<<10}
	st.Free = st.DBSize - st.DBSizeInUse
	putBack := func(n int64) writeSize {
		return writeSize{what: "rollback", bound: 3 * n, exact: func() (int64, error) { return n, nil }, replaced: func() (int64, error) { return n, nil }}
	}
	lines, err := fitQuota(st, q, putBack(2<<20+300<<10), true, nil)
	if err != nil || !strings.Contains(strings.Join(lines, "\n"), "is more than the") {
		t.Fatalf("a rollback after a compacting migrate: %v\n%s", err, strings.Join(lines, "\n"))
	}
	// Without compaction it is refused for the room, as before.
	if _, err := fitQuota(st, q, putBack(2<<20+300<<10), false, nil); err == nil || !strings.Contains(err.Error(), "the rollback would add about 2.3 MiB") {
		t.Fatalf("without compaction: %v", err)
	}
	// Little of what is in use is history the rollback knows of: no room.
	_, err = fitQuota(st, q, putBack(100<<10), true, nil)
	var pe *PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "even with history compaction there is no room: 3.3 MiB in use, of which the 100.0 KiB the rollback puts back may be history") ||
		!strings.Contains(err.Error(), "'etcdctl compact', then 'etcdctl defrag'") {
		t.Fatalf("a rollback with no room even after compaction: %v", err)
	}
	// migrate knows of no history: the pages in use are the live data.
	_, err = fitQuota(st, q, writeSize{what: "rewrite", bound: 4 << 20, exact: func() (int64, error) { return 4 << 20, nil }}, true, nil)
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "there is no room: 3.3 MiB in use in a 4.5 MiB quota") {
		t.Fatalf("a compacting migrate with no room: %v", err)
	}
}

// testFlags spells inputs as the command line does (command/errors.go), for
// the lines a test reads as an operator would.
func testFlags(n input.Name) string {
	if f, ok := map[input.Name]string{input.QuotaBackendBytes: "--quota-backend-bytes", input.APIServerManifest: "--apiserver-manifest",
		input.CompactHistory: "--compact-history", input.OutputSnapshot: "--output-snapshot", input.Resource: "--resource"}[n]; ok {
		return f
	}
	return input.Words(n)
}

// slowCompaction is etcd's own compaction that returns only once released:
// a compaction of millions of revisions, whose batches (each committed, its
// pages free) go on long after the old values it frees are gone.
type slowCompaction struct {
	etcdStatus
	release chan struct{}
}

func (s slowCompaction) compact(ctx context.Context, rev int64) error {
	err := s.etcdStatus.compact(ctx, rev)
	<-s.release
	return err
}

// TestGuardWritesOnceCompactionFreesRoom: a batch that does not fit below
// the quota waits for the room a compaction frees, not for its end. etcd's
// history holds an old value of every key; a compaction that frees them and
// then does not return (slowCompaction) lets the batch go once etcd shows
// the pages free; the run's end counts the compaction once etcd has taken
// it, without waiting for it to return.
func TestGuardWritesOnceCompactionFreesRoom(t *testing.T) {
	cli := testetcd.StartT(t, testetcd.Options{}).ClientT(t)
	ctx := context.Background()
	value := strings.Repeat("v", 4<<10)
	for gen := 0; gen < 2; gen++ {
		for i := 0; i < 1000; i++ {
			if _, err := cli.Put(ctx, fmt.Sprintf("/registry/secrets/ns/s-%04d", i), fmt.Sprint(gen)+value); err != nil {
				t.Fatal(err)
			}
		}
	}
	time.Sleep(150 * time.Millisecond) // etcd commits its backend every 100 ms
	st, err := etcdscan.Status(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	const cost = 2 << 20
	quota := Quota{Bytes: st.DBSize + 2<<20, Known: true} // its margin is 1 MiB
	if st.Free >= 1<<20 {
		t.Fatalf("test setup: %d bytes already free", st.Free)
	}
	slow := slowCompaction{etcdStatus{cli}, make(chan struct{})}
	g := newSpaceGuard(slow, quota, true, st)
	if g.fits(cost) {
		t.Fatalf("test setup: %d bytes fit in a database of %d (%d free) below %d", cost, st.DBSize, st.Free, quota.Bytes)
	}
	reserved := make(chan error, 1)
	go func() { reserved <- g.Reserve(ctx, cost) }()
	select {
	case err := <-reserved:
		if err != nil {
			t.Fatalf("Reserve while the compaction goes on: %v", err)
		}
	case <-time.After(time.Minute):
		close(slow.release)
		t.Fatalf("the batch still waits a minute after the compaction freed the old values (Reserve: %v)", <-reserved)
	}
	if g.Report().Compactions != 0 {
		t.Fatalf("the compaction counted before it ended: %+v", g.Report())
	}
	g.Done(cost)

	// The run's end waits for etcd to have taken the compaction, not for
	// etcd to have removed every old revision: that goes on in etcd.
	finished := make(chan struct{})
	go func() { g.Finish(ctx); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		close(slow.release)
		t.Fatal("the run's end still waits a minute for the last compaction to return")
	}
	defer close(slow.release)
	rep := g.Report()
	if rep.Compactions != 1 || rep.CompactedAt == 0 || !rep.LastGoesOn || rep.DBSizeMax >= quota.Bytes || rep.CompactSeconds <= 0 {
		t.Fatalf("after the compaction: %+v", rep)
	}
	if _, err := cli.Get(ctx, "/registry/secrets/ns/s-0000", clientv3.WithRev(rep.CompactedAt-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("a read below the revision the report says was compacted (%d): %v, want etcd's compacted error", rep.CompactedAt, err)
	}
}

// SQLiteQuota: a SQLite datastore has no quota; what stands for it is the
// file (with its write-ahead log) and its filesystem's free space, named on
// the preflight's line.
func TestSQLiteQuota(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "state.db")
	if err := os.WriteFile(db, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db+"-wal", make([]byte, 1024), 0o600); err != nil {
		t.Fatal(err)
	}
	free, err := freeBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	q := SQLiteQuota(db)
	// The free space moves with whatever else writes to the filesystem.
	if !q.SQLite || !q.Known || q.Bytes < 5120+free-(64<<20) || q.Bytes > 5120+free+(64<<20) {
		t.Errorf("SQLiteQuota: %+v, want about %d (the files and the free space)", q, 5120+free)
	}
	if line := q.line(Margin(q.Bytes)); !strings.HasPrefix(line, "SQLite has no quota") || !strings.Contains(line, db+" (5.0 KiB)") {
		t.Errorf("line: %q", line)
	}
	missing := SQLiteQuota(filepath.Join(dir, "gone", "state.db"))
	if missing.Known || missing.Bytes != DefaultQuotaBackendBytes || !strings.Contains(missing.Source, "unknown") {
		t.Errorf("SQLiteQuota of a file in a missing directory: %+v, want etcd's default, unknown", missing)
	}
}
