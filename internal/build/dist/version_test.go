package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sassoftware/go-rpmutils"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// scratch is a git repository in a temporary directory, committed to with
// fixed times: the version tests never depend on the project's history.
type scratch struct {
	t *testing.T
	repo
	clock time.Time
}

func newScratch(t *testing.T) *scratch {
	t.Helper()
	s := &scratch{t: t, repo: repo{dir: t.TempDir()}, clock: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s.run("init", "-q", "-b", "main")
	return s
}

func (s *scratch) run(args ...string) string {
	s.t.Helper()
	cmd := exec.Command("git", append([]string{"-C", s.dir}, args...)...)
	when := s.clock.Format(time.RFC3339)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid", "GIT_COMMITTER_NAME=t",
		"GIT_COMMITTER_EMAIL=t@example.invalid", "GIT_AUTHOR_DATE="+when, "GIT_COMMITTER_DATE="+when, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// commit writes the files (path: content) and commits them, an hour after
// the previous commit; it returns the commit's hash.
func (s *scratch) commit(files map[string]string) string {
	s.t.Helper()
	for path, content := range files {
		p := filepath.Join(s.dir, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			s.t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			s.t.Fatal(err)
		}
	}
	s.clock = s.clock.Add(time.Hour)
	s.run("add", "-A")
	s.run("commit", "-q", "-m", "change")
	return s.run("rev-parse", "HEAD")
}

func buildinfoSource(v string) string {
	return "package buildinfo\n\nconst Release = \"" + v + "\"\n"
}

const changelog100 = `# Changelog

## [Unreleased]

## [1.0.0] - 2026-12-01
%COMMIT%
Kubernetes 1.37.2 and etcd 3.7.3 linked.

## [0.2.0] - 2026-11-23

Commit ` + "`bc0d8d5`" + `. The last before versioned builds.
`

// cut is a scratch history of a release cut as docs/releasing.md says: the
// release commit (changelog entry and Release), the commit that names it in
// the changelog, and a later commit.
type cut struct {
	s                       *scratch
	release, naming, after  string
	releaseTime, namingTime time.Time
}

func newCut(t *testing.T) cut {
	s := newScratch(t)
	s.commit(map[string]string{buildinfoFile: buildinfoSource("v0.2.0"), changelogFile: "# Changelog\n\n## [Unreleased]\n\n## [0.2.0] - 2026-11-23\n\nCommit `bc0d8d5`.\n", "main.go": "package main\n"})
	c := cut{s: s}
	c.release = s.commit(map[string]string{buildinfoFile: buildinfoSource("v1.0.0"), changelogFile: strings.Replace(changelog100, "%COMMIT%", "", 1)})
	c.releaseTime = s.clock
	c.naming = s.commit(map[string]string{changelogFile: strings.Replace(changelog100, "%COMMIT%", "\nCommit `"+c.release[:7]+"`.", 1)})
	c.namingTime = s.clock
	c.after = s.commit(map[string]string{"main.go": "package main // later\n"})
	return c
}

// TestTheNamedCommitIsTheRelease: the commit CHANGELOG.md's entry names
// (from the commit after it) is stamped vX.Y.Z, whichever later commit's
// changelog is read; asked for explicitly, the same.
func TestTheNamedCommitIsTheRelease(t *testing.T) {
	c := newCut(t)
	for _, changelogAt := range []string{c.naming, c.after, "HEAD"} {
		st, err := resolve(c.s.repo, c.release, changelogAt, "")
		if err != nil {
			t.Fatal(err)
		}
		if st.Version != "v1.0.0" || !st.Release || st.Commit != c.release || !st.Time.Equal(c.releaseTime) || st.Why != "" {
			t.Errorf("changelog at %s: the release commit is %+v, want v1.0.0, a release", changelogAt, st)
		}
		if v, pre := st.packageVersion(); v != "1.0.0" || pre != "" {
			t.Errorf("package version %q %q", v, pre)
		}
	}
	// Its abbreviation, as a runbook would type it.
	st, err := resolve(c.s.repo, c.release[:9], "HEAD", "v1.0.0")
	if err != nil || st.Version != "v1.0.0" || !st.Release {
		t.Errorf("RELEASE_VERSION=v1.0.0 RELEASE_COMMIT=%s: %+v, %v", c.release[:9], st, err)
	}
}

// TestAnyOtherCommitIsADevelopmentBuild: the commit that names the release,
// a later one, and the release commit itself read with its own changelog
// (which cannot name it) are development builds of the next version, in Go's
// pseudo-version form, saying why; asked for the release's version, they are
// refused with the commit that is.
func TestAnyOtherCommitIsADevelopmentBuild(t *testing.T) {
	c := newCut(t)
	for _, tc := range []struct {
		name, rev, changelogAt, why string
		when                        time.Time
	}{
		{"the naming commit", c.naming, "HEAD", "v1.0.0 is commit " + c.release[:12] + " (CHANGELOG.md), not " + c.naming[:12] + ": make release RELEASE_COMMIT=" + c.release[:12] + " builds v1.0.0", c.namingTime},
		{"a later commit", c.after, "HEAD", "not " + c.after[:12], c.s.clock},
		{"the release commit before it is named", c.release, c.release, "CHANGELOG.md's entry v1.0.0 names no commit yet", c.releaseTime},
	} {
		st, err := resolve(c.s.repo, tc.rev, tc.changelogAt, "")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		want := "v1.0.1-0." + tc.when.Format("20060102150405") + "-" + tc.rev[:12]
		if st.Version != want || st.Release || !strings.Contains(st.Why, tc.why) {
			t.Errorf("%s: %+v, want %s, a development build, why containing %q", tc.name, st, want, tc.why)
		}
		// After the release, before the next one, in Go's, deb's and rpm's order.
		if !module.IsPseudoVersion(st.Version) || semver.Compare(st.Version, "v1.0.0") <= 0 || semver.Compare(st.Version, "v1.0.1") >= 0 {
			t.Errorf("%s: %s is not a pseudo-version between v1.0.0 and v1.0.1", tc.name, st.Version)
		}
		v, pre := st.packageVersion()
		pkg := v + "~" + pre
		if v != "1.0.1" || strings.Contains(pre, "-") || rpmutils.Vercmp(pkg, "1.0.0") <= 0 || rpmutils.Vercmp(pkg, "1.0.1") >= 0 {
			t.Errorf("%s: package version %s does not sort between 1.0.0 and 1.0.1", tc.name, pkg)
		}
		if _, err := resolve(c.s.repo, tc.rev, tc.changelogAt, "v1.0.0"); err == nil {
			t.Errorf("%s: RELEASE_VERSION=v1.0.0 was stamped on it", tc.name)
		}
	}
	_, err := resolve(c.s.repo, c.naming, "HEAD", "v1.0.0")
	if want := "v1.0.0 is commit " + c.release[:12] + " (CHANGELOG.md), not " + c.naming[:12] + ": make release RELEASE_COMMIT=" + c.release[:12]; err == nil || err.Error() != want {
		t.Errorf("RELEASE_VERSION=v1.0.0 on the naming commit: %v, want %q", err, want)
	}
}

// TestExplicitVersionsRefused: what make release refuses before building or
// removing anything, each saying why.
func TestExplicitVersionsRefused(t *testing.T) {
	c := newCut(t)
	for _, tc := range []struct{ rev, version, want string }{
		{c.release, "1.0", "RELEASE_VERSION=1.0 is not a semantic version"},
		{c.release, "v9.9.9", "v9.9.9 has no entry in CHANGELOG.md"},
		{c.release, "v0.2.0", "v0.2.0 is not this source's version v1.0.0"},
		{"no-such-rev", "", `"no-such-rev" is not a commit`},
	} {
		if _, err := resolve(c.s.repo, tc.rev, "HEAD", tc.version); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("RELEASE_COMMIT=%s RELEASE_VERSION=%s: %v, want %q", tc.rev, tc.version, err, tc.want)
		}
	}
	// A commit before versioned builds cannot be built at all.
	c.s.run("checkout", "-q", "--orphan", "old")
	c.s.run("rm", "-rqf", ".")
	old := c.s.commit(map[string]string{"main.go": "package main\n"})
	if _, err := resolve(c.s.repo, old, "main", ""); err == nil || !strings.Contains(err.Error(), "predates versioned builds") {
		t.Errorf("a commit without Release: %v", err)
	}
	// The entry names a commit this clone lacks: a development build saying so.
	c.s.run("checkout", "-q", "main")
	lacking := c.s.commit(map[string]string{changelogFile: strings.Replace(changelog100, "%COMMIT%", "\nCommit `0123456789abcdef`.", 1)})
	st, err := resolve(c.s.repo, lacking, "HEAD", "")
	if err != nil || st.Release || !strings.Contains(st.Why, "names commit 0123456789abcdef for v1.0.0, which this clone does not have") {
		t.Errorf("an entry naming a missing commit: %+v, %v", st, err)
	}
}

// TestParseChangelogNamesCommits: the commit an entry names is its first
// "Commit `HASH`" line; an entry naming none has none.
func TestParseChangelogNamesCommits(t *testing.T) {
	got := parseChangelog("# C\n\n## [Unreleased]\n\nCommit `aaaaaaa`. (not an entry)\n\n## [1.1.0] - 2027-01-01\n\nNo commit named.\n\n## [1.0.0] - 2026-12-01\n\nCommit `0123abcd`, the first.\nCommit `ffffffff`.\n")
	want := []changelogEntry{{"1.1.0", ""}, {"1.0.0", "0123abcd"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("entries %+v, want %+v", got, want)
	}
}
