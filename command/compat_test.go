package command

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// lastRelease is the commit of the latest release CHANGELOG.md names
// ("## [X.Y.Z] - DATE" then "Commit `HASH`.").
func lastRelease(t *testing.T) (version, commit string) {
	t.Helper()
	b, err := os.ReadFile("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?m)^## \\[([0-9][^]]*)\\][^\\n]*\\n\\nCommit `([0-9a-f]+)`").FindSubmatch(b)
	if m == nil {
		t.Fatal("CHANGELOG.md names no release commit")
	}
	return string(m[1]), string(m[2])
}

// releasedBinary builds the latest release's tool from its commit (git
// archive of this repository: the source as it was released).
func releasedBinary(t *testing.T) string {
	t.Helper()
	version, commit := lastRelease(t)
	dir := t.TempDir()
	archive := exec.Command("git", "-C", "..", "archive", "--format=tar", commit)
	var tarball, errb bytes.Buffer
	archive.Stdout, archive.Stderr = &tarball, &errb
	if err := archive.Run(); err != nil {
		t.Fatalf("git archive of release %s (%s): %v\n%s", version, commit, err, errb.String())
	}
	untar := exec.Command("tar", "-x", "-C", dir)
	untar.Stdin = &tarball
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "kube-etcd-migrate-"+version)
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of release %s: %v\n%s", version, err, out)
	}
	return bin
}

// TestRollbackOfReleasedRuns: the run directories the latest release's
// binary leaves (a run killed mid-write, then one to the end) are listed and
// verified by this build, and its 'rollback --run' puts every key back byte
// for byte: an operator who upgrades the tool between a migration and its
// rollback loses nothing.
func TestRollbackOfReleasedRuns(t *testing.T) {
	released := releasedBinary(t)
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	const n = 400
	c.SeedMany(n, oldCfg)
	before := c.Raw()
	state := testcluster.StateDir(t)
	t.Setenv(undo.EnvStateDir, state)
	conn := []string{"--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37", "--liveness-window", "500ms"}

	killMidRunOf(t, released, c, 50, append([]string{"migrate", "--writers", "1", "--batch-ops", "1", "--resource", "secrets"}, conn...)...)
	if out, err := exec.Command(released, append([]string{"migrate"}, conn...)...).CombinedOutput(); err != nil {
		t.Fatalf("the released migrate: %v\n%s", err, out)
	}
	if c.Raw()[firstKey(before)] == before[firstKey(before)] {
		t.Fatal("the released migrate wrote nothing")
	}

	code, out, stderr := runCLI(t, "runs", "--verify")
	if code != exitOK || !strings.Contains(out, "0001-migrate") || !strings.Contains(out, "0002-migrate") {
		t.Fatalf("runs --verify of the released runs: exit %d\n%s%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "500ms")
	if code != exitOK {
		t.Fatalf("rollback of the released runs: exit %d\n%s%s", code, out, stderr)
	}
	c.RequireBack(before)
}

func firstKey(m map[string]string) string {
	for k := range m {
		if strings.Contains(k, "/secrets/") {
			return k
		}
	}
	return ""
}
