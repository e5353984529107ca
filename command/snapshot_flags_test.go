package command

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/seed"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/verify"
)

// seededSnapshot seeds a stale cluster (seed.Cluster), saves a snapshot of it
// and returns the etcd, the seed and the file.
func seededSnapshot(t *testing.T) (*testetcd.Server, *seed.Result, string) {
	t.Helper()
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	res, err := seed.Cluster(context.Background(), cli, seed.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "backup.db")
	if err := etcdscan.Snapshot(context.Background(), cli, snap); err != nil {
		t.Fatal(err)
	}
	return srv, res, snap
}

func sum256(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestSnapshotFileCLI: inventory and verify of a snapshot file print what they
// print for the live etcd, with the same exit codes, and one line on stderr
// about the file; migrate writes a re-encrypted copy, verifies it (exit 0 for
// that copy) and never touches the input.
func TestSnapshotFileCLI(t *testing.T) {
	srv, res, snap := seededSnapshot(t)
	before := sum256(t, snap)
	t.Setenv("TMPDIR", t.TempDir())
	for _, cmd := range [][]string{
		{"inventory"},
		{"verify", "--encryption-provider-config", res.NewConfig},
		{"inspect", res.SecretKey, "--encryption-provider-config", res.NewConfig},
	} {
		liveCode, live, liveErr := runCLI(t, append(cmd, "--endpoints", srv.Endpoint)...)
		code, out, stderr := runCLI(t, append(cmd, "--snapshot-file", snap)...)
		if code != liveCode || out != live {
			t.Errorf("%v: exit %d on the file, %d live; stdout differs: %v\nfile:\n%s\nlive:\n%s\nstderr %s %s", cmd, code, liveCode, out != live, out, live, stderr, liveErr)
		}
		if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.HasPrefix(lines[0], "snapshot "+snap+": sha256 verified, revision ") {
			t.Errorf("%v: stderr %q, want one line describing the file", cmd, stderr)
		}
	}
	if code, _, _ := runCLI(t, "verify", "--snapshot-file", snap, "--encryption-provider-config", res.NewConfig); code != exitStale {
		t.Fatalf("verify of the seeded snapshot: exit %d, want 3", code)
	}
	// etcd credentials read in place: a file has no auth; one warning line
	// names the flags, and the answer is the same.
	t.Setenv("ETCDCTL_PASSWORD", "secret")
	code, _, stderr := runCLI(t, "verify", "--snapshot-file", snap, "--encryption-provider-config", res.NewConfig, "--user", "root")
	if want := "warning: --user and --password ignored: " + snap + " is read in place, and a snapshot file has no etcd auth"; code != exitStale || strings.Count(stderr, "\n") != 2 || !strings.Contains(stderr, want) {
		t.Errorf("verify --snapshot-file --user (ETCDCTL_PASSWORD set): exit %d, stderr %q; want exit 3 and one warning %q", code, stderr, want)
	}
	os.Unsetenv("ETCDCTL_PASSWORD")

	out := filepath.Join(t.TempDir(), "rotated.db")
	journal := filepath.Join(t.TempDir(), "journal")
	code, stdout, stderr := runCLI(t, "migrate", "--snapshot-file", snap, "--output-snapshot", out, "--encryption-provider-config", res.NewConfig, "--journal", journal, "--target-version", "1.37")
	if code != exitOK {
		t.Fatalf("migrate --snapshot-file: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"no kube-apiserver can reach " + snap + ": a snapshot file, read in place and never modified", "wrote " + out, "verified " + out + ", read afresh", "verify would exit 0"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("migrate output lacks %q:\n%s", want, stdout)
		}
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("output %v %v, want mode 0600", fi, err)
	}
	// --journal given: every rewrite journaled, with OUT's revisions.
	if b, err := os.ReadFile(journal); err != nil || bytes.Count(b, []byte(`"op":"done"`)) < 49 {
		t.Errorf("journal %s: %v, %d done record(s); want one per rewrite", journal, err, bytes.Count(b, []byte(`"op":"done"`)))
	}
	if code, _, stderr := runCLI(t, "verify", "--snapshot-file", out, "--encryption-provider-config", res.NewConfig); code != exitOK {
		t.Errorf("verify of the output: exit %d (%s)", code, stderr)
	}
	// Again: the output exists.
	if code, _, stderr := runCLI(t, "migrate", "--snapshot-file", snap, "--output-snapshot", out, "--encryption-provider-config", res.NewConfig, "--target-version", "1.37"); code != exitUsage || !strings.Contains(stderr, "--force") {
		t.Errorf("migrate onto an existing output: exit %d %q", code, stderr)
	}
	if sum256(t, snap) != before {
		t.Error("the input snapshot changed")
	}
	if left, _ := os.ReadDir(os.Getenv("TMPDIR")); len(left) != 0 {
		t.Errorf("left in $TMPDIR: %v", left)
	}
}

// withoutKey1 writes the rotated configuration without key1's two lines.
func withoutKey1(t *testing.T, newConfig string) string {
	t.Helper()
	newCfg, err := os.ReadFile(newConfig)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	lines := strings.Split(string(newCfg), "\n")
	for i := 0; i < len(lines); i++ {
		if strings.Contains(lines[i], "name: key1") {
			i++ // and its secret
			continue
		}
		kept = append(kept, lines[i])
	}
	key2Only := filepath.Join(t.TempDir(), "key2-only.yaml")
	if err := os.WriteFile(key2Only, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return key2Only
}

// TestSnapshotOutputRestores: migrate's --output-snapshot, restored with
// etcdutl's restore code and served by etcd, holds every key of the input:
// the keys the run did not write byte for byte with their revisions,
// version and lease; the rewritten ones (as many as the run says) with
// their create revision and lease, version one more, at revisions above
// the input's; every object readable with key2 alone, none in the input.
func TestSnapshotOutputRestores(t *testing.T) {
	srv, res, snap := seededSnapshot(t)
	ctx := context.Background()
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	all := func(cli *clientv3.Client) (map[string]*mvccpb.KeyValue, int64) {
		resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey())
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]*mvccpb.KeyValue{}
		for _, kv := range resp.Kvs {
			m[string(kv.Key)] = kv
		}
		return m, resp.Header.Revision
	}
	in, inRev := all(cli)
	key2Only := withoutKey1(t, res.NewConfig)
	out := filepath.Join(t.TempDir(), "out.db")
	code, stdout, stderr := runCLI(t, "migrate", "--snapshot-file", snap, "--output-snapshot", out, "--encryption-provider-config", res.NewConfig, "--target-version", "1.37", "-o", "json")
	if code != exitOK {
		t.Fatalf("migrate: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var sum struct{ Summary struct{ Rewritten int } }
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil || sum.Summary.Rewritten == 0 {
		t.Fatalf("migrate -o json: %v, %d rewritten\n%s", err, sum.Summary.Rewritten, stdout)
	}
	if code, _, stderr := runCLI(t, "verify", "--snapshot-file", out, "--encryption-provider-config", key2Only); code != exitOK {
		t.Errorf("verify of the output with key2 alone: exit %d (%s)", code, stderr)
	}
	if code, _, _ := runCLI(t, "verify", "--snapshot-file", snap, "--encryption-provider-config", key2Only); code != exitUnreadable {
		t.Errorf("verify of the input with key2 alone: exit %d, want 4", code)
	}
	dst := testetcd.StartT(t, testetcd.Options{RestoreFrom: out})
	dcli, err := dst.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer dcli.Close()
	got, rev := all(dcli)
	if len(got) != len(in) {
		t.Errorf("restored %d keys; want %d", len(got), len(in))
	}
	rewritten := 0
	for k, w := range in {
		g := got[k]
		switch {
		case g == nil:
			t.Errorf("%s: missing from the output", k)
		case bytes.Equal(g.Value, w.Value):
			if g.ModRevision != w.ModRevision || g.CreateRevision != w.CreateRevision || g.Version != w.Version || g.Lease != w.Lease {
				t.Errorf("%s unchanged: mod %d create %d version %d lease %x; want %d %d %d %x", k, g.ModRevision, g.CreateRevision, g.Version, g.Lease, w.ModRevision, w.CreateRevision, w.Version, w.Lease)
			}
		default:
			rewritten++
			if g.ModRevision <= inRev || g.CreateRevision != w.CreateRevision || g.Version != w.Version+1 || g.Lease != w.Lease {
				t.Errorf("%s rewritten: mod %d create %d version %d lease %x; want above %d, %d, %d, %x", k, g.ModRevision, g.CreateRevision, g.Version, g.Lease, inRev, w.CreateRevision, w.Version+1, w.Lease)
			}
		}
	}
	// The CRD whose storedVersions the run trimmed is one more write.
	if rewritten < sum.Summary.Rewritten || rewritten > sum.Summary.Rewritten+1 {
		t.Errorf("%d keys differ from the input, the run rewrote %d", rewritten, sum.Summary.Rewritten)
	}
	if rev != inRev+int64(rewritten) {
		t.Errorf("restored at revision %d, want %d: one revision per key written", rev, inRev+int64(rewritten))
	}
}

// TestQuarantineSnapshotFileCLI: key1 is lost; quarantine of a backup's
// secrets under it writes a copy whose every object reads with key2 alone, and
// a journal that rollback can replay.
func TestQuarantineSnapshotFileCLI(t *testing.T) {
	srv, res, snap := seededSnapshot(t)
	before := sum256(t, snap)
	key2Only := withoutKey1(t, res.NewConfig)
	if code, _, stderr := runCLI(t, "verify", "--snapshot-file", snap, "--encryption-provider-config", key2Only); code != exitUnreadable {
		t.Fatalf("verify with key1 lost: exit %d, want 4 (%s)", code, stderr)
	}
	code, stdout, stderr := runCLI(t, "quarantine", "--snapshot-file", snap, "--encryption-provider-config", key2Only, "--reason", "undecryptable", "--resource", "secrets", "--dry-run")
	if code != exitOK || !strings.Contains(stdout, "dry run: would remove 24 of 24 unreadable") {
		t.Fatalf("dry run: exit %d\n%s\n%s", code, stdout, stderr)
	}
	out := filepath.Join(t.TempDir(), "cleared.db")
	journal := filepath.Join(t.TempDir(), "quarantine.journal")
	code, stdout, stderr = runCLI(t, "quarantine", "--snapshot-file", snap, "--output-snapshot", out, "--journal", journal,
		"--encryption-provider-config", key2Only, "--reason", "undecryptable", "--resource", "secrets")
	if code != exitOK || !strings.Contains(stdout, "removed 24 of 24 unreadable") || !strings.Contains(stdout, "0 unreadable") {
		t.Fatalf("quarantine: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code, out, stderr := runCLI(t, "verify", "--snapshot-file", out, "--encryption-provider-config", key2Only, "-o", "json"); code == exitUnreadable || !strings.Contains(out, `"unreadable": 0`) {
		t.Errorf("verify of the quarantined copy: exit %d\n%s\n%s", code, out, stderr)
	}
	if fi, err := os.Stat(journal); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
		t.Errorf("journal %v %v", fi, err)
	}
	// Quarantining another reason removes none of them: OUT is written, and
	// its verification finds them still unreadable: exit 4, as verify of OUT.
	out2 := filepath.Join(t.TempDir(), "kept.db")
	code, stdout, stderr = runCLI(t, "quarantine", "--snapshot-file", snap, "--output-snapshot", out2, "--journal", journal+"2",
		"--encryption-provider-config", key2Only, "--reason", "corrupt-payload", "--resource", "secrets")
	if code != exitUnreadable || !strings.Contains(stdout, "removed 0 of 24 unreadable") || !strings.Contains(stdout, "kept 24") || !strings.Contains(stdout, "24 unreadable: verify would exit 4") {
		t.Errorf("quarantine of another reason: exit %d, want 4\n%s\n%s", code, stdout, stderr)
	}
	if code, _, _ := runCLI(t, "verify", "--snapshot-file", out2, "--encryption-provider-config", key2Only, "--resource", "secrets"); code != exitUnreadable {
		t.Errorf("verify of OUT: exit %d, want 4 as quarantine said", code)
	}
	// The same on the live etcd: the objects it kept are unreadable still, exit 4.
	code, stdout, stderr = runCLI(t, "quarantine", "--endpoints", srv.Endpoint, "--liveness-window", "300ms", "--journal", journal+"3",
		"--encryption-provider-config", key2Only, "--reason", "corrupt-payload", "--resource", "secrets")
	if code != exitUnreadable || !strings.Contains(stdout, "removed 0 of 24 unreadable") || !strings.Contains(stdout, "kept 24") {
		t.Errorf("live quarantine of another reason: exit %d, want 4\n%s\n%s", code, stdout, stderr)
	}
	if sum256(t, snap) != before {
		t.Error("the input snapshot changed")
	}
}

// TestOutputVerdict: migrate --output-snapshot exits as the verification of
// the OUT it wrote: 3 when OUT is still stale, with a line that says OUT was
// written (not "no --output-snapshot written"); 4 when unreadable objects
// were carried over (the report lists them: no error line); 0 when current.
func TestOutputVerdict(t *testing.T) {
	for _, tc := range []struct {
		counts verify.Counts
		code   int
		line   string
	}{
		{verify.Counts{Objects: 10, Current: 8, Stale: 2}, exitStale, "error: --output-snapshot out.db was written, but its verification finds 2 object(s) still stale in it: do not restore it; migrate it again (--snapshot-file out.db)"},
		{verify.Counts{Objects: 10, Current: 7, Stale: 2, Unreadable: 1}, exitUnreadable, ""},
		{verify.Counts{Objects: 10, Current: 10}, exitOK, ""},
	} {
		var stderr strings.Builder
		code := exitFor(outputVerdict("out.db", &verify.Report{Summary: tc.counts}), &stderr)
		if code != tc.code || strings.TrimSpace(stderr.String()) != tc.line || strings.Contains(stderr.String(), "no --output-snapshot written") {
			t.Errorf("%+v: exit %d, stderr %q; want %d, %q", tc.counts, code, stderr.String(), tc.code, tc.line)
		}
	}
}

func TestSnapshotFileUsageErrors(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "exists.db")
	if err := os.WriteFile(existing, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "--output-snapshot", filepath.Join(dir, "o.db")}, "--output-snapshot needs --snapshot-file"},
		{[]string{"migrate", "--snapshot-file", existing}, "give --output-snapshot"},
		{[]string{"migrate", "--snapshot-file", existing, "--dry-run", "--output-snapshot", filepath.Join(dir, "o.db")}, "--dry-run"},
		{[]string{"migrate", "--snapshot-file", existing, "--output-snapshot", existing, "--force"}, "is the --snapshot-file itself"},
		{[]string{"migrate", "--snapshot-file", filepath.Join(dir, "in.db"), "--output-snapshot", existing}, "exists"},
		{[]string{"migrate", "--snapshot-file", existing, "--snapshot", filepath.Join(dir, "s.db"), "--dry-run"}, "--snapshot"},
		{[]string{"quarantine", "--resource", "secrets", "--journal", "j"}, "--reason"},
		{[]string{"quarantine", "--reason", "would-lose-fields", "--resource", "secrets", "--journal", "j"}, "never removes a readable object"},
		{[]string{"quarantine", "--reason", "undecryptable", "--journal", "j"}, "--resource"},
		{[]string{"quarantine", "--reason", "undecryptable", "--resource", "secrets", "--no-undo"}, "--no-undo"},
		{[]string{"migrate", "--no-undo", "--journal", "j"}, "--no-undo"},
		{[]string{"migrate", "--snapshot", existing}, "never replaced"},
	} {
		code, _, stderr := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line saying %q", tc.args, code, stderr, tc.want)
		}
	}
	// A damaged file is an operational error naming it.
	code, _, stderr := runCLI(t, "verify", "--snapshot-file", existing)
	if code != exitError || !strings.Contains(stderr, existing) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("verify of a non-snapshot: exit %d, stderr %q", code, stderr)
	}
	// So is a migrate of it, which writes no output.
	o := filepath.Join(dir, "never.db")
	code, _, stderr = runCLI(t, "migrate", "--snapshot-file", existing, "--output-snapshot", o)
	if _, err := os.Stat(o); code != exitError || !strings.Contains(stderr, existing) || strings.Count(stderr, "\n") != 1 || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("migrate of a non-snapshot: exit %d, stderr %q, output %v", code, stderr, err)
	}
}

// TestSnapshotFileSignals: SIGINT while quarantine reads a snapshot file in
// place and writes its --output-snapshot, once (the run stops) or twice (it
// exits at once), leaves nothing half-built beside the output (the output
// whole, or none) and nothing in $TMPDIR; the input is not changed.
func TestSnapshotFileSignals(t *testing.T) {
	_, res, snap := seededSnapshot(t)
	before := sum256(t, snap)
	bin := toolBinary(t)
	for _, signals := range []int{1, 2} {
		tmp, outDir := t.TempDir(), t.TempDir()
		out := filepath.Join(outDir, "q.db")
		cmd := exec.Command(bin, "quarantine", "--snapshot-file", snap, "--output-snapshot", out,
			"--encryption-provider-config", res.NewConfig, "--reason", "undecryptable", "--resource", "secrets")
		cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
		stderr := &lockedBuffer{}
		// Once the file is opened, interrupt.
		code := runInterrupted(t, cmd, stderr, "read in place", signals, 20*time.Millisecond)
		// 1 (interrupted), 130 (second signal); 0 or 3 if it finished first.
		if code != 1 && code != 130 && code != 0 && code != 3 {
			t.Errorf("%d signal(s): exit %d, stderr %q", signals, code, stderr.String())
		}
		// Nothing half-built: OUT is there whole (published before the
		// signal stopped its verification, or the run finished) or not at
		// all, and nothing else is beside it.
		left, _ := os.ReadDir(outDir)
		for _, e := range left {
			if e.Name() != "q.db" {
				t.Errorf("%d signal(s): left beside the output: %s (stderr %s)", signals, e.Name(), stderr.String())
				continue
			}
			f, err := snapshotdb.Open(out, snapshotdb.Options{})
			if err != nil {
				t.Errorf("%d signal(s): %s left, but not whole: %v (stderr %s)", signals, out, err, stderr.String())
				continue
			}
			f.Close()
		}
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Errorf("%d signal(s): left in $TMPDIR: %v (stderr %s)", signals, left, stderr.String())
		}
	}
	if sum256(t, snap) != before {
		t.Error("the input snapshot changed")
	}
}

// runInterrupted starts cmd, its stderr into stderr, waits until stderr
// says ready, sends it signals SIGINTs gap apart and returns its exit code
// (0 when it finished first).
func runInterrupted(t *testing.T, cmd *exec.Cmd, stderr *lockedBuffer, ready string, signals int, gap time.Duration) int {
	t.Helper()
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), ready) {
		if time.Now().After(deadline) {
			t.Fatalf("%q never came: %s", ready, stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for range signals {
		_ = cmd.Process.Signal(syscall.SIGINT)
		time.Sleep(gap)
	}
	err := cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	} else if err != nil {
		t.Fatalf("%d signal(s): %v", signals, err)
	}
	return 0
}

// lockedBuffer is a bytes.Buffer a child process writes while the test reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
