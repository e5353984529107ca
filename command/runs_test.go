package command

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// TestRunsPrune: old runs removed as an operator would, --dry-run first.
// A migration (0001), one killed part-way (0002) and its rerun that
// finished the change (0003): keeping the newest run keeps 0002 with it
// (0002's snapshot, not 0003's, is the state before their change), so only
// 0001 goes; the dry run says so and what it frees, and removes nothing.
// Afterwards no run is missing, and 'rollback --run 0002' undoes the change
// byte for byte. While another process holds the state directory (a run
// going on), the prune is refused.
func TestRunsPrune(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	cfg2 := c.EncryptionConfig("key2.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	cfg3 := c.EncryptionConfig("key3.yaml", testcluster.AESCBC("key3", 3), testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(1500, oldCfg)
	state := testcluster.StateDir(t)
	t.Setenv(undo.EnvStateDir, state)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--target-version", "1.37", "--liveness-window", "500ms"}
	if code, out, stderr := runCLI(t, append([]string{"migrate", "--encryption-provider-config", cfg2}, conn...)...); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	afterFirst := c.Raw()
	killMidRun(t, c, 100, append([]string{"migrate", "--encryption-provider-config", cfg3, "--writers", "1", "--batch-ops", "1", "--resource", "secrets"}, conn...)...)
	if code, out, stderr := runCLI(t, append([]string{"migrate", "--encryption-provider-config", cfg3}, conn...)...); code != exitOK {
		t.Fatalf("the rerun: exit %d\n%s%s", code, out, stderr)
	}

	code, out, stderr := runCLI(t, "runs", "--prune", "--keep", "1", "--dry-run")
	for _, want := range []string{
		"would remove 0001-migrate (" + filepath.Join(state, "runs", "0001-migrate"),
		"keeps 0002-migrate with 0003-migrate: run 0002-migrate was killed and the runs after it up to 0003-migrate carried on its change: its snapshot, not theirs, is the state before it",
		"would free ", "keeps 0002-migrate to 0003-migrate",
		"run the same command without --dry-run to remove 0001-migrate",
	} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("runs --prune --keep 1 --dry-run does not say %q: exit %d\n%s%s", want, code, out, stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "runs", "0001-migrate")); err != nil {
		t.Fatalf("the dry run removed a run: %v", err)
	}

	held, err := undo.StateDir(state).Open()
	if err != nil {
		t.Fatal(err)
	}
	code, out, stderr = runCLI(t, "runs", "--prune", "--keep", "1")
	if code != exitError || !strings.Contains(stderr, "is in use by another run (pid ") || !strings.Contains(stderr, "nothing was removed") {
		t.Fatalf("runs --prune while the state directory is held: exit %d\n%s%s", code, out, stderr)
	}
	held.Close()

	code, out, stderr = runCLI(t, "runs", "--prune", "--keep", "1", "-o", "json")
	var pruned undo.PruneResult
	if code != exitOK || json.Unmarshal([]byte(out), &pruned) != nil || len(pruned.Removed) != 1 || pruned.Removed[0].ID != "0001-migrate" || pruned.Freed <= 0 {
		t.Fatalf("runs --prune --keep 1: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "runs", "-o", "json")
	var listed struct {
		Runs    []undo.Record     `json:"runs"`
		Missing []undo.MissingRun `json:"missing"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Runs) != 2 || listed.Runs[0].ID != "0002-migrate" || len(listed.Missing) != 0 {
		t.Fatalf("runs after the prune: exit %d\n%s%s", code, out, stderr)
	}
	if code, out, stderr := runCLI(t, "runs", "--prune", "--before", "9"); code != exitUsage || !strings.Contains(stderr, `--before: no run "9"`) {
		t.Errorf("--before a run that is not there: exit %d\n%s%s", code, out, stderr)
	}

	// The group kept whole: its rollback is the change undone.
	if code, out, stderr := runCLI(t, "rollback", "--run", "0002-migrate", "--encryption-provider-config", cfg3, "--endpoints", c.Srv.Endpoint, "--liveness-window", "500ms"); code != exitOK {
		t.Fatalf("rollback --run 0002-migrate after the prune: exit %d\n%s%s", code, out, stderr)
	}
	now := c.Raw()
	for k, v := range afterFirst {
		if now[k] != v {
			t.Fatalf("%s is not as the first migration left it", k)
		}
	}
}

// TestRunsShowRestores: 'runs --show ID' prints the run's record, its
// rollback, and the restore of its snapshot on every member: the members
// from etcd's member list, the data directory from etcd's manifest beside
// kube-apiserver's, the checksum recorded at the run's end (sha256sum's).
// The commands it prints, carried out on this one-member etcd (etcdutl's
// own restore command with the printed arguments, the data directories
// moved as printed), bring back the state before the run byte for byte.
// Without etcd or a manifest, the values are placeholders, said so.
func TestRunsShowRestores(t *testing.T) {
	tmp := t.TempDir()
	c := testcluster.New(t, testetcd.Options{Dir: filepath.Join(tmp, "etcd")})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	c.SeedMany(50, oldCfg)
	before := c.Raw()
	state := testcluster.StateDir(t)
	if code, out, stderr := runCLI(t, "migrate", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37", "--liveness-window", "500ms"); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	dataDir := filepath.Join(tmp, "etcd", "data")
	manifest := kubeadmManifest(t, c.Srv.Endpoint)
	etcdBeside(t, manifest, dataDir)
	// The member's name in etcd's manifest is the member's own.
	etcdYAML := filepath.Join(filepath.Dir(manifest), "etcd.yaml")
	b, err := os.ReadFile(etcdYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(etcdYAML, []byte(strings.Replace(string(b), "--name=cp-1", "--name="+c.Srv.Name(), 1)), 0o600); err != nil {
		t.Fatal(err)
	}

	snap := filepath.Join(state, "runs", "0001-migrate", undo.SnapshotFile)
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	code, out, stderr := runCLI(t, "runs", "--show", "1", "--apiserver-manifest", manifest)
	t.Logf("runs --show:\n%s", out)
	if code != exitOK {
		t.Fatalf("runs --show: exit %d\n%s%s", code, out, stderr)
	}
	for _, want := range []string{
		"run 0001-migrate\n", "kube-etcd-migrate rollback --run 0001-migrate --state-dir " + state + " --dry-run",
		"sha256sum " + snap + "    # must print " + hex.EncodeToString(sum[:]),
		"sha256 " + hex.EncodeToString(sum[:]) + ", recorded at the run's end",
		"# " + c.Srv.Name() + " (this node): the snapshot is here",
		"mv " + dataDir + " " + dataDir + ".before-0001-migrate && mv " + dataDir + ".restore-0001-migrate " + dataDir,
		"note: members: etcd's member list", "note: data directory: --data-dir of " + etcdYAML,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("runs --show does not say %q", want)
		}
	}
	var restore []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "etcdutl" {
			restore = f
		}
	}
	if len(restore) == 0 || !strings.Contains(strings.Join(restore, " "), "--name "+c.Srv.Name()+" --initial-cluster "+c.Srv.Name()+"=http://127.0.0.1:") || !strings.Contains(strings.Join(restore, " "), "--bump-revision 1000000000 --mark-compacted") {
		t.Fatalf("no etcdutl restore of the member: %q", restore)
	}

	// Carried out: etcd stopped, restored as etcdutl's restore command does
	// with the printed flags, the directories moved, started.
	c.Srv.Stop()
	fs := flag.NewFlagSet("etcdutl snapshot restore", flag.ContinueOnError)
	name, cluster, peers, dir := fs.String("name", "", ""), fs.String("initial-cluster", "", ""), fs.String("initial-advertise-peer-urls", "", ""), fs.String("data-dir", "", "")
	token := fs.String("initial-cluster-token", "etcd-cluster", "")
	bump, compacted := fs.Uint64("bump-revision", 0, ""), fs.Bool("mark-compacted", false, "")
	if err := fs.Parse(restore[4:]); err != nil || restore[3] != snap || fs.NArg() != 0 {
		t.Fatalf("the restore command %q: %v", restore, err)
	}
	if err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath: restore[3], Name: *name, OutputDataDir: *dir, OutputWALDir: filepath.Join(*dir, "member", "wal"),
		PeerURLs: strings.Split(*peers, ","), InitialCluster: *cluster, InitialClusterToken: *token,
		RevisionBump: *bump, MarkCompacted: *compacted,
	}); err != nil {
		t.Fatalf("%q: %v", restore, err)
	}
	if err := os.Rename(dataDir, dataDir+".before-0001-migrate"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dataDir+".restore-0001-migrate", dataDir); err != nil {
		t.Fatal(err)
	}
	if err := c.Srv.Restart(); err != nil {
		t.Fatal(err)
	}
	after := c.Raw()
	if len(after) != len(before) {
		t.Fatalf("%d keys after the restore, %d before the run", len(after), len(before))
	}
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("%s is not as it was before the run", k)
		}
	}

	// Nothing known of the members: placeholders, said so.
	code, out, stderr = runCLI(t, "runs", "--show", "0001-migrate", "-o", "json")
	var shown struct {
		Run     undo.Record  `json:"run"`
		Restore *restorePlan `json:"restore"`
	}
	if code != exitOK || json.Unmarshal([]byte(out), &shown) != nil || shown.Restore == nil {
		t.Fatalf("runs --show -o json: exit %d\n%s%s", code, out, stderr)
	}
	if m := shown.Restore.Members; len(m) != 1 || !m[0].Placeholder || shown.Restore.DataDir != phDataDir || shown.Restore.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("the restore without etcd or a manifest: %+v", shown.Restore)
	}
	if !strings.Contains(strings.Join(shown.Restore.Commands, "\n"), "etcdutl snapshot restore "+snap+" --name <MEMBER_NAME> --initial-cluster <NAME1=PEER_URL1,NAME2=PEER_URL2,...> --initial-advertise-peer-urls <PEER_URL> --initial-cluster-token etcd-restore-0001-migrate --bump-revision 1000000000 --mark-compacted --data-dir <DATA_DIR>.restore-0001-migrate") {
		t.Errorf("the placeholder commands:\n%s", strings.Join(shown.Restore.Commands, "\n"))
	}
	if code, _, stderr := runCLI(t, "runs", "--show", "7"); code != exitUsage || !strings.Contains(stderr, `--show: no run "7"`) {
		t.Errorf("--show of a run that is not there: exit %d %s", code, stderr)
	}
}
