package migrate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/target"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/undo"
)

// spaceSeed is the keyspace the space tests rotate: n secrets of about 2 KB
// under aescbc key1, each taking a page of etcd's backend, and the
// configuration that moves them to key2.
type spaceSeed struct {
	c      *testcluster.Cluster
	newCfg string
	values map[string][]byte
}

const spaceSecrets = 600

func seedSpace(t *testing.T, quota int64) *spaceSeed {
	t.Helper()
	c := testcluster.New(t, testetcd.Options{QuotaBackendBytes: quota})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	s := &spaceSeed{c: c, newCfg: c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1)), values: map[string][]byte{}}
	var ops []clientv3.Op
	for i := 0; i < spaceSecrets; i++ {
		ns, name := fmt.Sprintf("ns%d", i%5), fmt.Sprintf("s-%04d", i)
		key := "/registry/secrets/" + ns + "/" + name
		v := c.Encode(key, testcluster.SecretsGR, testcluster.Secret(ns, name, strings.Repeat(fmt.Sprintf("%x", i), 2000)[:2000]), "", "", oldCfg)
		s.values[key] = v
		ops = append(ops, clientv3.OpPut(key, string(v)))
		if len(ops) == 32 || i == spaceSecrets-1 {
			if _, err := c.Cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	time.Sleep(150 * time.Millisecond) // etcd commits its backend every 100 ms: Status sees it all
	return s
}

// checkRestored checks that exactly restored keys hold their bytes from
// before the migration, as a stopped rollback says.
func (s *spaceSeed) checkRestored(t *testing.T, restored int) {
	t.Helper()
	back := 0
	for key, want := range s.values {
		if got, _, _ := s.c.Get(key); bytes.Equal(got, want) {
			back++
		}
	}
	if back != restored {
		t.Fatalf("%d keys hold their old bytes, the rollback says %d restored", back, restored)
	}
}

func (s *spaceSeed) env() *pipeline.Env {
	return s.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: s.newCfg}, Resources: []string{"secrets"}, PageSize: 50})
}

func alarms(t *testing.T, cli *clientv3.Client) []string {
	t.Helper()
	a, err := etcdscan.Alarms(context.Background(), cli)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestQuotaFoundAndCompactHistory: not told etcd's quota, the run finds it in
// etcd's own metrics (not the 2 GiB default), refuses a rewrite twice the
// room left before writing anything, and with --compact-history carries it
// out below the quota, never raising etcd's alarm. Told a smaller quota, the
// run keeps below that one.
func TestQuotaFoundAndCompactHistory(t *testing.T) {
	const quota = 4<<20 + 512<<10
	s := seedSpace(t, quota)
	ctx := context.Background()
	env := s.env()

	found := guard.FindQuota(ctx, s.c.Cli, "", 0, testFlags)
	if found.Bytes != quota || !found.Known || !strings.Contains(found.Source, etcdscan.QuotaMetric) {
		t.Fatalf("not told: found %+v, want %d from %s", found, quota, etcdscan.QuotaMetric)
	}
	if told := guard.FindQuota(ctx, s.c.Cli, "", 3<<20, testFlags); told.Bytes != 3<<20 || !strings.HasPrefix(told.Source, "--quota-backend-bytes") {
		t.Fatalf("told a smaller quota: %+v", told)
	}
	if told := guard.FindQuota(ctx, s.c.Cli, "", 1<<30, testFlags); told.Bytes != quota || !strings.Contains(told.Source, "etcd enforces its own") {
		t.Fatalf("told a larger quota than etcd's: %+v", told)
	}

	st, err := etcdscan.Status(ctx, s.c.Cli)
	if err != nil {
		t.Fatal(err)
	}
	sizes, err := guard.MeasureRewrite(ctx, env)
	if err != nil {
		t.Fatal(err)
	}
	rewrite := sizes.EtcdBytes
	// A dry run adds up the same sizes (what plan hands to the preflight).
	if dry := run(t, env, Options{DryRun: true}); dry.WriteSizes == nil || *dry.WriteSizes != sizes {
		t.Fatalf("a dry run's sizes %+v, the preflight's pass %+v", dry.WriteSizes, sizes)
	}
	// Given them, the preflight takes them as they are (no pass of its own).
	if _, _, err := guard.CheckQuota(ctx, env, guard.PreflightOptions{Sizes: &guard.WriteSizes{EtcdBytes: 7 << 30}}); err == nil || !strings.Contains(err.Error(), "would add about 7.0 GiB") {
		t.Fatalf("the preflight given a dry run's sizes: %v", err)
	}
	room := quota - guard.Margin(quota) - st.DBSize + st.Free
	t.Logf("database %d (%d free), rewrite %d, room %d", st.DBSize, st.Free, rewrite, room)
	if rewrite < 2*room {
		t.Fatalf("test setup: the rewrite (%d bytes) is not twice the room left below the quota (%d)", rewrite, room)
	}

	before := s.c.Revision()
	_, err = Run(ctx, env, Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow}})
	var pe *guard.PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), textfmt.Bytes(quota)) || !strings.Contains(err.Error(), etcdscan.QuotaMetric) || !strings.Contains(err.Error(), string(input.CompactHistory)) {
		t.Fatalf("a rewrite past the quota found in etcd's metrics: err = %v", err)
	}
	if s.c.Revision() != before {
		t.Fatal("the refused run wrote")
	}

	sum, err := Run(ctx, env, Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, CompactHistory: true, Journal: filepath.Join(s.c.Dir, "journal"), Spell: testFlags}})
	if err != nil {
		t.Fatalf("--compact-history: %v", err)
	}
	if sum.Summary.Rewritten != spaceSecrets || sum.Summary.Failed != 0 {
		t.Fatalf("--compact-history: %+v", sum.Summary)
	}
	if a := alarms(t, s.c.Cli); len(a) != 0 {
		t.Fatalf("etcd raised %v", a)
	}
	sp := sum.Space
	if sp == nil || sp.Compactions == 0 || sp.DBSizeMax >= quota || sp.DBSizeAfter >= quota {
		t.Fatalf("space report %+v", sp)
	}
	if !strings.Contains(strings.Join(sum.Preflight, "\n"), "etcd's quota: "+textfmt.Bytes(quota)+", from "+etcdscan.QuotaMetric) ||
		!strings.Contains(strings.Join(sum.Preflight, "\n"), "--compact-history") {
		t.Fatalf("preflight lines:\n%s", strings.Join(sum.Preflight, "\n"))
	}
	t.Logf("rewrote %d secrets (%s) with %s of room: database %s -> %s, at most %s, %d compaction(s)",
		sum.Summary.Rewritten, textfmt.Bytes(rewrite), textfmt.Bytes(room), textfmt.Bytes(sp.DBSizeBefore), textfmt.Bytes(sp.DBSizeAfter), textfmt.Bytes(sp.DBSizeMax), sp.Compactions)

	// Everything is current now.
	again := run(t, env, Options{DryRun: true})
	if again.Summary.Stale != 0 || again.Summary.Current != spaceSecrets {
		t.Fatalf("after the run: %+v", again.Summary)
	}
}

// TestNoSpaceStopsRunAndRollbackAfterRemedy: another writer fills etcd until
// its NOSPACE alarm is raised (and then deletes what it wrote, which does not
// disarm it) in the middle of a run: the run stops at its first refused
// batch with one line naming the cause and the remedy, the journal is intact
// and the failures are one line per cause. Rollback refuses under the alarm,
// and after the remedy restores every key byte for byte.
func TestNoSpaceStopsRunAndRollbackAfterRemedy(t *testing.T) {
	const quota = 8 << 20
	s := seedSpace(t, quota)
	ctx := context.Background()
	const batch = 16
	sum, journal, err := s.runInterrupted(t, batch, func() error { return fillToAlarm(ctx, s.c.Cli) })
	stoppedMidRun(t, sum, err, etcdscan.CauseNoSpace, batch, journal, "NOSPACE", "etcdctl compact", "etcdctl defrag", "etcdctl alarm disarm", "--quota-backend-bytes")

	// Rollback needs room too: refused under the alarm, nothing written.
	before := s.c.Revision()
	if _, err := rollback.Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli}); err == nil || !strings.Contains(err.Error(), "NOSPACE") || !strings.Contains(err.Error(), "alarm disarm") {
		t.Fatalf("rollback under the alarm: %v", err)
	}
	if s.c.Revision() != before {
		t.Fatal("rollback wrote under the alarm")
	}

	// The remedy the message names: compact, defragment, disarm.
	st, err := etcdscan.Status(ctx, s.c.Cli)
	if err != nil {
		t.Fatal(err)
	}
	if err := etcdscan.Compact(ctx, s.c.Cli, st.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Cli.Defragment(ctx, s.c.Srv.URL); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	res, err := rollback.Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli})
	if err != nil || res.Failed != 0 || int64(res.Restored) != sum.Summary.Rewritten {
		t.Fatalf("rollback after the remedy: %+v %v", res, err)
	}
	for key, want := range s.values {
		if got, _, _ := s.c.Get(key); !bytes.Equal(got, want) {
			t.Fatalf("%s: not restored byte for byte", key)
		}
	}
}

// TestGuardStopsBeforeQuota: another writer takes the room a run counted on
// (without reaching the quota): the run stops before etcd's quota, with the
// remedy, and etcd raises no alarm.
func TestGuardStopsBeforeQuota(t *testing.T) {
	const quota = 8 << 20
	s := seedSpace(t, quota)
	ctx := context.Background()
	filled := false
	var fillErr error
	sum, err := Run(ctx, s.env(), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow}, Writers: 1, Progress: func(n Counts) {
		if !filled && n.Scanned >= 200 {
			filled = true
			fillErr = fillBelow(ctx, s.c.Cli, quota-guard.Margin(quota)/2)
		}
	}})
	if fillErr != nil {
		t.Fatal(fillErr)
	}
	var se *guard.SpaceError
	if !errors.As(err, &se) || !strings.Contains(err.Error(), string(input.CompactHistory)) {
		t.Fatalf("err = %v, want a stop before the quota", err)
	}
	if a := alarms(t, s.c.Cli); len(a) != 0 {
		t.Fatalf("etcd raised %v", a)
	}
	if sum.Summary.Failed != 0 || sum.Summary.Rewritten == 0 || sum.Summary.Rewritten >= spaceSecrets {
		t.Fatalf("%+v", sum.Summary)
	}
}

// fillToAlarm writes 64 KiB values until etcd raises NOSPACE, then deletes
// them and compacts: the alarm stays until disarmed, the room is back.
func fillToAlarm(ctx context.Context, cli *clientv3.Client) error {
	big := strings.Repeat("f", 64<<10)
	var err error
	for i := 0; i < 2000; i++ {
		if _, err = cli.Put(ctx, fmt.Sprintf("/filler/%04d", i), big); err != nil {
			break
		}
		if i%8 == 7 {
			time.Sleep(110 * time.Millisecond) // etcd checks the committed size
		}
	}
	if !etcdscan.IsNoSpace(err) {
		return fmt.Errorf("filling etcd: %v", err)
	}
	resp, err := cli.Delete(ctx, "/filler/", clientv3.WithPrefix())
	if err != nil {
		return err
	}
	return etcdscan.Compact(ctx, cli, resp.Header.Revision)
}

// fillBelow writes 64 KiB values until every member's database is at least
// limit (below the quota).
func fillBelow(ctx context.Context, cli *clientv3.Client, limit int64) error {
	big := strings.Repeat("f", 64<<10)
	n := 0
	for i := 0; i < 200; i++ {
		time.Sleep(110 * time.Millisecond) // etcd commits its backend every 100 ms
		st, err := etcdscan.Status(ctx, cli)
		if err != nil {
			return err
		}
		left := limit - st.DBSize - st.Free/2
		if left <= 0 {
			return nil
		}
		// Half of what is left each round: a 64 KiB value takes 17 pages.
		for k := max(1, left/2/(68<<10)); k > 0; k-- {
			if _, err := cli.Put(ctx, fmt.Sprintf("/filler/%04d", n), big); err != nil {
				return err
			}
			n++
		}
	}
	return errors.New("could not fill etcd")
}

// runInterrupted migrates the seed with one writer, batch puts a
// transaction and a journal, calling interrupt once after 200 objects were
// scanned (its error fails the test).
func (s *spaceSeed) runInterrupted(t *testing.T, batch int, interrupt func() error) (*Summary, string, error) {
	t.Helper()
	journal := filepath.Join(s.c.Dir, "journal")
	var ierr error
	done := false
	sum, err := Run(context.Background(), s.env(), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, Journal: journal}, Writers: 1, BatchOps: batch, Progress: func(n Counts) {
		// Mid-run: once some keys are rewritten (the whole keyspace may
		// be decided, and held, before the first write).
		if done || n.Rewritten == 0 {
			return
		}
		done = true
		ierr = interrupt()
	}})
	if ierr != nil {
		t.Fatal(ierr)
	}
	if !done {
		t.Fatal("the run ended before it was interrupted")
	}
	return sum, journal, err
}

// stoppedMidRun checks a run that etcd stopped with cause: one line saying
// each of wants and the journal, at most one batch of failed writes, all of
// that cause, some keys rewritten and some not, and a journal whose done
// records are exactly the keys rewritten.
func stoppedMidRun(t *testing.T, sum *Summary, err error, cause string, batch int, journal string, wants ...string) *guard.StopError {
	t.Helper()
	var stop *guard.StopError
	if !errors.As(err, &stop) || stop.Fatal.Cause != cause {
		t.Fatalf("err = %v, want a stop for %s", err, cause)
	}
	msg := err.Error()
	t.Logf("%s", msg)
	for _, want := range append(wants, stop.Key, journal) {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("not one line: %q", msg)
	}
	if sum.Summary.Failed == 0 || sum.Summary.Failed > int64(batch) {
		t.Fatalf("failed %d writes: want at most one batch (%d) after the refusal", sum.Summary.Failed, batch)
	}
	if sum.Summary.Rewritten == 0 || sum.Summary.Rewritten+sum.Summary.Failed >= spaceSecrets {
		t.Fatalf("the run did not stop mid-way: %+v", sum.Summary)
	}
	if len(sum.Causes) != 1 || sum.Causes[0].Cause != cause || sum.Causes[0].Count != sum.Summary.Failed || sum.Causes[0].FirstKey == "" {
		t.Fatalf("causes %+v", sum.Causes)
	}
	if done := journalDone(t, journal); int64(done) != sum.Summary.Rewritten {
		t.Fatalf("journal: %d done records, %d rewritten", done, sum.Summary.Rewritten)
	}
	return stop
}

// journalDone parses every record of a journal (it must be whole) and counts
// its done records.
func journalDone(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r undo.JournalRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("journal record %q: %v", sc.Text(), err)
		}
		if r.Op == "done" {
			n++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNoSpaceMidRollback: another writer fills etcd to its quota while a
// rollback runs: the rollback stops at the first refusal with one line (the
// remedy, and that the same rollback is to be run again), writes nothing
// more, and run again after the remedy it restores the rest: every key holds
// its bytes from before the migration.
func TestNoSpaceMidRollback(t *testing.T) {
	s := seedSpace(t, 16<<20)
	ctx := context.Background()
	journal := filepath.Join(s.c.Dir, "journal")
	sum, err := Run(ctx, s.env(), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, Journal: journal, CompactHistory: true}, Writers: 1, BatchOps: 16})
	if err != nil || sum.Summary.Rewritten != spaceSecrets {
		t.Fatalf("migrate: %+v %v", sum.Summary, err)
	}

	// The rollback's own client: before its 24th transaction (it reads a batch
	// of keys in one, then writes the batch in one: the 12th batch's write)
	// another client fills etcd until the NOSPACE alarm is raised.
	var writes atomic.Int64
	var fillErr error
	fill := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Txn") && writes.Add(1) == 24 {
			fillErr = fillToAlarm(ctx, s.c.Cli)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	rcli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.c.Srv.URL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(fill)}})
	if err != nil {
		t.Fatal(err)
	}
	defer rcli.Close()
	res, err := rollback.Rollback(ctx, rcli, journal, &etcdscan.Writer{Client: rcli})
	if fillErr != nil {
		t.Fatal(fillErr)
	}
	var stop *guard.StopError
	if !errors.As(err, &stop) || stop.Fatal.Cause != etcdscan.CauseNoSpace || stop.Verb != "rollback" {
		t.Fatalf("rollback: %+v %v, want stopped by etcd out of space", res, err)
	}
	msg := err.Error()
	t.Logf("%s", msg)
	for _, want := range []string{"NOSPACE", stop.Key, journal, "rollback needs room too", "alarm disarm", "run the same rollback again"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error does not say %q: %s", want, msg)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("not one line: %q", msg)
	}
	// The refused transaction's keys (one batch) failed; nothing after it was sent.
	if res.Failed < 1 || res.Failed > etcdscan.DefaultMaxOps || res.Restored < 150 || res.Restored >= spaceSecrets {
		t.Fatalf("rollback did not stop mid-way at the refusal: %+v", res)
	}
	s.checkRestored(t, res.Restored)

	// The remedy the message names (the filler is gone and compacted):
	// defragment, disarm; the same rollback again restores the rest.
	if _, err := s.c.Cli.Defragment(ctx, s.c.Srv.URL); err != nil {
		t.Fatal(err)
	}
	if _, err := s.c.Cli.AlarmDisarm(ctx, &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	again, err := rollback.Rollback(ctx, s.c.Cli, journal, &etcdscan.Writer{Client: s.c.Cli})
	if err != nil || again.Failed != 0 || again.Skipped != 0 || again.Restored+res.Restored != spaceSecrets || again.Unchanged != res.Restored {
		t.Fatalf("rollback after the remedy: %+v %v (first: %+v)", again, err, res)
	}
	for key, want := range s.values {
		if got, _, _ := s.c.Get(key); !bytes.Equal(got, want) {
			t.Fatalf("%s: not restored byte for byte", key)
		}
	}
}

// TestRollbackKeepsBelowQuota is the full-etcd rollback at small scale: a
// migrate that fit only by compacting as it went (--compact-history) leaves
// a database whose room is less than the old values its rollback must write
// back. Rollback's preflight refuses that before any write, naming
// compaction; without the preflight, the rollback's guard stops it before
// etcd's quota (no alarm, the journal intact, no key half-written); with
// compaction it restores every key byte for byte, below the quota, no alarm.
func TestRollbackKeepsBelowQuota(t *testing.T) {
	const quota = 5 << 20
	s := seedSpace(t, quota)
	ctx := context.Background()
	journal := filepath.Join(s.c.Dir, "journal")
	sum, err := Run(ctx, s.env(), Options{PreflightOptions: guard.PreflightOptions{LivenessWindow: testWindow, CompactHistory: true, Journal: journal}})
	if err != nil || sum.Summary.Rewritten != spaceSecrets {
		t.Fatalf("migrate --compact-history: %+v %v", sum.Summary, err)
	}
	time.Sleep(150 * time.Millisecond)
	st, err := etcdscan.Status(ctx, s.c.Cli)
	if err != nil {
		t.Fatal(err)
	}
	need, err := guard.RollbackBytes([]string{journal})
	if err != nil {
		t.Fatal(err)
	}
	room := quota - guard.Margin(quota) - st.DBSize + st.Free
	t.Logf("after migrate: database %s (%s free), the rollback writes %s, room %s", textfmt.Bytes(st.DBSize), textfmt.Bytes(st.Free), textfmt.Bytes(need), textfmt.Bytes(room))
	if need <= room {
		t.Fatalf("test setup: the rollback (%d bytes) fits the room left (%d)", need, room)
	}
	if bound := 3 * fileSize(t, journal); need > bound {
		t.Fatalf("the journal's cheap bound %d is below what its records add up to, %d", bound, need)
	}

	// The preflight refuses, before any write, naming compaction.
	q := guard.FindQuota(ctx, s.c.Cli, "", 0, testFlags)
	before := s.c.Revision()
	_, err = guard.CheckRollbackQuota(ctx, s.c.Cli, []string{journal}, q, false, nil)
	var pe *guard.PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "the rollback would add about") || !strings.Contains(err.Error(), string(input.CompactHistory)) {
		t.Fatalf("rollback's preflight: %v, want a refusal naming %s", err, input.CompactHistory)
	}
	lines, err := guard.CheckRollbackQuota(ctx, s.c.Cli, []string{journal}, q, true, nil)
	if err != nil || !strings.Contains(strings.Join(lines, "\n"), "is more than the") {
		t.Fatalf("rollback's preflight with compaction: %v\n%s", err, strings.Join(lines, "\n"))
	}

	// Without the preflight and without compaction, the guard stops the
	// rollback before the quota.
	res, err := rollback.RollbackJournals(ctx, s.c.Cli, &etcdscan.Writer{Client: s.c.Cli}, []string{journal}, rollback.RollbackOptions{Quota: &q, BatchOps: 16})
	var se *guard.SpaceError
	if !errors.As(err, &se) || se.Verb != "rollback" || se.Journal != journal || !strings.Contains(err.Error(), "run the same rollback again with "+string(input.CompactHistory)) {
		t.Fatalf("rollback without compaction: %+v %v, want a stop before the quota", res, err)
	}
	if a := alarms(t, s.c.Cli); len(a) != 0 {
		t.Fatalf("etcd raised %v", a)
	}
	if res.Failed != 0 || res.Restored == 0 || res.Restored >= spaceSecrets || res.Space == nil || res.Space.DBSizeMax >= quota {
		t.Fatalf("stopped rollback: %+v space %+v", res, res.Space)
	}
	s.checkRestored(t, res.Restored)
	if s.c.Revision() <= before {
		t.Fatal("the guarded rollback wrote nothing")
	}

	// With compaction the same rollback finishes: every key as before the migration.
	again, err := rollback.RollbackJournals(ctx, s.c.Cli, &etcdscan.Writer{Client: s.c.Cli}, []string{journal}, rollback.RollbackOptions{Quota: &q, CompactHistory: true, BatchOps: 16})
	if err != nil || again.Failed != 0 || again.Skipped != 0 || again.Restored+res.Restored != spaceSecrets {
		t.Fatalf("rollback with compaction: %+v %v (first: %+v)", again, err, res)
	}
	if a := alarms(t, s.c.Cli); len(a) != 0 {
		t.Fatalf("etcd raised %v", a)
	}
	if sp := again.Space; sp == nil || sp.Compactions == 0 || sp.DBSizeMax >= quota {
		t.Fatalf("space report %+v", sp)
	}
	for key, want := range s.values {
		if got, _, _ := s.c.Get(key); !bytes.Equal(got, want) {
			t.Fatalf("%s: not restored byte for byte", key)
		}
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
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
