package buildinfo

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The repository's root, from this package's directory (tests run there).
const repoRoot = "../.."

// changelogEntry is one "## [X.Y.Z] - YYYY-MM-DD" heading of CHANGELOG.md.
type changelogEntry struct {
	version string // without the leading v
	date    string
	named   bool // its text has a "Commit `HASH`" line: the commit make release stamps
}

var (
	entryRE      = regexp.MustCompile(`^## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$`)
	unreleasedRE = regexp.MustCompile(`^## \[Unreleased\]$`)
	// namedRE is how an entry names its commit, as make release reads it
	// (internal/build/dist).
	namedRE = regexp.MustCompile("^Commit `[0-9a-f]{7,40}`")
)

// parseChangelog returns the released entries, newest first as written,
// whether an Unreleased section comes before them, and what is wrong: a "## "
// heading that is neither (a typo there would hide a release from make
// release), an Unreleased section after a release.
func parseChangelog(text string) (entries []changelogEntry, unreleasedFirst bool, problems []string) {
	for i, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "## ") {
			if len(entries) > 0 && namedRE.MatchString(l) {
				entries[len(entries)-1].named = true
			}
			continue
		}
		if unreleasedRE.MatchString(l) {
			if len(entries) > 0 {
				problems = append(problems, fmt.Sprintf("CHANGELOG.md:%d: [Unreleased] after a released entry", i+1))
			}
			unreleasedFirst = len(entries) == 0
			continue
		}
		m := entryRE.FindStringSubmatch(l)
		if m == nil {
			problems = append(problems, fmt.Sprintf("CHANGELOG.md:%d: %q is neither \"## [Unreleased]\" nor \"## [X.Y.Z] - YYYY-MM-DD\"", i+1, l))
			continue
		}
		entries = append(entries, changelogEntry{version: m[1] + "." + m[2] + "." + m[3], date: m[4]})
	}
	return entries, unreleasedFirst, problems
}

// semverLess compares two X.Y.Z versions.
func semverLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := range 3 {
		x, _ := strconv.Atoi(as[i])
		y, _ := strconv.Atoi(bs[i])
		if x != y {
			return x < y
		}
	}
	return false
}

// TestReleaseIsTheChangelogsLatest: the version every binary of this source
// prints (Release) is CHANGELOG.md's latest released entry, the entries are
// newest first with dates that do not go forward, and an Unreleased section
// heads them for the next release's notes.
func TestReleaseIsTheChangelogsLatest(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	entries, unreleasedFirst, problems := parseChangelog(string(data))
	for _, p := range problems {
		t.Error(p)
	}
	if len(entries) == 0 {
		t.Fatal("CHANGELOG.md has no released entry")
	}
	if !unreleasedFirst {
		t.Error("CHANGELOG.md: no [Unreleased] section before the released entries")
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(Release) {
		t.Errorf("Release %q is not a semantic version vMAJOR.MINOR.PATCH", Release)
	}
	if latest := "v" + entries[0].version; Release != latest {
		t.Errorf("Release is %s, CHANGELOG.md's latest released entry is %s: cutting a release changes both (docs/releasing.md)", Release, latest)
	}
	for i := 1; i < len(entries); i++ {
		newer, older := entries[i-1], entries[i]
		if !semverLess(older.version, newer.version) {
			t.Errorf("CHANGELOG.md: %s listed after %s: newest first", older.version, newer.version)
		}
		if older.date > newer.date {
			t.Errorf("CHANGELOG.md: %s (%s) is dated after %s (%s)", older.version, older.date, newer.version, newer.date)
		}
	}
	// Every release names its commit, as make release reads it ("Commit
	// `HASH`." on a line of its own): the newest may not yet, between the
	// release commit and the one that names it (docs/releasing.md).
	for _, e := range entries[1:] {
		if !e.named {
			t.Errorf("CHANGELOG.md: %s names no commit (a line \"Commit `HASH`.\"): make release cannot stamp it on any", e.version)
		}
	}
}

// TestParseChangelogCatchesMistakes: the checks above fail on a changelog
// whose headings are mistyped or out of order.
func TestParseChangelogCatchesMistakes(t *testing.T) {
	entries, unreleasedFirst, problems := parseChangelog("# Changelog\n\n## [1.1.0] - 2026-12-01\n## [Unreleased]\n## [1.0.0] 2026-11-30\n")
	if len(problems) != 2 || !strings.Contains(problems[0], ":4: [Unreleased] after") || !strings.Contains(problems[1], `:5: "## [1.0.0] 2026-11-30" is neither`) {
		t.Errorf("a mistyped heading and an Unreleased section after a release: problems %q", problems)
	}
	if unreleasedFirst || len(entries) != 1 || entries[0].version != "1.1.0" {
		t.Errorf("entries %v, unreleased first %v", entries, unreleasedFirst)
	}
	entries, _, _ = parseChangelog("## [Unreleased]\n\n## [1.1.0] - 2026-12-01\n\nCommit `0123abc`.\n\n## [1.0.0] - 2026-11-30\n\nThe commit 0123abd.\n")
	if len(entries) != 2 || !entries[0].named || entries[1].named {
		t.Errorf("which entries name their commit: %+v", entries)
	}
	if !semverLess("0.9.0", "0.10.0") || semverLess("1.0.0", "0.10.0") || semverLess("1.0.0", "1.0.0") {
		t.Error("semverLess compares as strings")
	}
}
