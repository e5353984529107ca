package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// makeTarget runs make in the repository root; it returns the exit code and
// the combined output.
func makeTarget(t *testing.T, args ...string) (int, string) {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed to test the Makefile's release targets: %v", err)
	}
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", root}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatalf("make %v: %v", args, err)
	}
	return 0, out.String()
}

// TestMakeReleaseChecksFirst: make release refuses, before building or
// removing anything, a version that is not a semantic version, one with no
// changelog entry, and one this commit is not; make release-check says what
// a build of HEAD would be called, as the tool resolves it.
func TestMakeReleaseChecksFirst(t *testing.T) {
	dist := filepath.Join(t.TempDir(), "dist")
	st, err := resolve(repo{dir: root}, "HEAD", "HEAD", "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ version, want string }{
		{"1.0", "RELEASE_VERSION=1.0 is not a semantic version"},
		{"v9.9.9", "v9.9.9 has no entry in CHANGELOG.md"},
		{"v0.1.0", "v0.1.0 is not this source's version " + st.Source},
	} {
		code, out := makeTarget(t, "release", "RELEASE_VERSION="+c.version, "DIST="+dist)
		if code == 0 || !strings.Contains(out, c.want) {
			t.Errorf("make release RELEASE_VERSION=%s: exit %d, want an error containing %q:\n%s", c.version, code, c.want, out)
		}
		if _, err := os.Stat(dist); err == nil {
			t.Errorf("make release RELEASE_VERSION=%s created DIST before refusing", c.version)
		}
	}
	code, out := makeTarget(t, "release-check")
	want := "development build " + st.Version + " of commit " + st.Commit
	if st.Release {
		want = "release " + st.Version + ": commit " + st.Commit
	}
	if code != 0 || !strings.Contains(out, want) {
		t.Errorf("make release-check: exit %d, want 0 and %q:\n%s", code, want, out)
	}
}
