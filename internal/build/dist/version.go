package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Which version a build of a commit gets. A release is named twice: by the
// source (Release in internal/buildinfo/buildinfo.go, what every build of it
// prints) and by CHANGELOG.md, whose entry names the one commit that is the
// release ("Commit `0123abc`."). A commit cannot name itself, so the entry
// names the release commit from the commit after it (docs/releasing.md,
// "Cutting a release"): the changelog that names a commit is read from HEAD
// (a later commit), the source's version from the commit built.
//
// The named commit is stamped with its version; any other commit is a
// development build of the next version, in the Go toolchain's pseudo-version
// form (v1.0.1-0.20261201120000-0123456789ab after v1.0.0): it sorts after the
// release and before the next, and it names its commit. A version asked for
// explicitly (RELEASE_VERSION) is stamped only on the commit its entry names;
// anything else is refused.

const (
	buildinfoFile = "internal/buildinfo/buildinfo.go"
	changelogFile = "CHANGELOG.md"
)

var (
	releaseConstRE = regexp.MustCompile(`(?m)^const Release = "(v\d+\.\d+\.\d+)"$`)
	semverRE       = regexp.MustCompile(`^v(\d+)\.(\d+)\.(\d+)$`)
	entryRE        = regexp.MustCompile(`^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$`)
	namedCommitRE  = regexp.MustCompile("^Commit `([0-9a-f]{7,40})`")
)

// stamp is what a build of one commit is called.
type stamp struct {
	Commit  string    // the full hash built
	Time    time.Time // its commit time, UTC: every mtime in the packages and the image
	Version string    // vX.Y.Z on the commit CHANGELOG.md names for it, else a development version
	Release bool      // Version is a release: this is the commit its entry names
	Source  string    // the source's own version (Release in internal/buildinfo)
	// Why is, for a development build, why it is not the release, and how to
	// build that.
	Why string
}

// packageVersion is the version as deb and rpm order it: X.Y.Z, and for a
// development build the pre-release after a tilde (1.0.1~0.20261201120000.0123456789ab
// sorts before 1.0.1 and after 1.0.0 in both).
func (s stamp) packageVersion() (version, prerelease string) {
	v := strings.TrimPrefix(s.Version, "v")
	version, pre, _ := strings.Cut(v, "-")
	return version, strings.ReplaceAll(pre, "-", ".")
}

// changelogEntry is a released entry of CHANGELOG.md and the commit it names
// ("" when it names none yet).
type changelogEntry struct {
	version string // X.Y.Z
	commit  string // as written: a hash or an abbreviation of one
}

// parseChangelog returns the released entries, newest first, each with the
// commit its text names first ("Commit `HASH`" at the start of a line).
func parseChangelog(text string) []changelogEntry {
	var entries []changelogEntry
	in := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "## ") {
			m := entryRE.FindStringSubmatch(l)
			in = m != nil
			if in {
				entries = append(entries, changelogEntry{version: m[1]})
			}
			continue
		}
		if in && entries[len(entries)-1].commit == "" {
			if m := namedCommitRE.FindStringSubmatch(l); m != nil {
				entries[len(entries)-1].commit = m[1]
			}
		}
	}
	return entries
}

// refusal is a version that cannot be stamped on the commit asked for.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

func refuse(format string, args ...any) error { return &refusal{fmt.Sprintf(format, args...)} }

// resolve says what the build of rev is called, with CHANGELOG.md read at
// changelogRev (HEAD: it may name rev, which cannot name itself), and
// explicit the version asked for ("" for whatever rev is).
func resolve(r repo, rev, changelogRev, explicit string) (stamp, error) {
	hash, ok := r.commit(rev)
	if !ok {
		return stamp{}, refuse("%q is not a commit of %s", rev, r.dir)
	}
	source := versionOf(r, hash)
	if source == "" {
		return stamp{}, refuse("commit %s predates versioned builds: its %s has no `const Release = \"vX.Y.Z\"`", short(hash), buildinfoFile)
	}
	t, err := r.commitTime(hash)
	if err != nil {
		return stamp{}, err
	}
	st := stamp{Commit: hash, Time: t, Source: source}
	text, err := r.show(changelogRev, changelogFile)
	if err != nil {
		return stamp{}, fmt.Errorf("%s of %s: %w", changelogFile, changelogRev, err)
	}
	entries := parseChangelog(text)
	entryOf := func(v string) (changelogEntry, bool) {
		for _, e := range entries {
			if "v"+e.version == v {
				return e, true
			}
		}
		return changelogEntry{}, false
	}

	if explicit != "" {
		if !semverRE.MatchString(explicit) {
			return stamp{}, refuse("RELEASE_VERSION=%s is not a semantic version vMAJOR.MINOR.PATCH", explicit)
		}
		e, ok := entryOf(explicit)
		if !ok {
			return stamp{}, refuse("%s has no entry in %s (\"## [%s] - YYYY-MM-DD\"): write what it changes for operators there first (docs/releasing.md)", explicit, changelogFile, strings.TrimPrefix(explicit, "v"))
		}
		if explicit != st.Source {
			return stamp{}, refuse("%s is not this source's version %s (Release in %s of commit %s): build the commit its changelog entry names, or cut the release (docs/releasing.md)", explicit, st.Source, buildinfoFile, short(hash))
		}
		named, err := namedCommit(r, e)
		if err != nil {
			return stamp{}, err
		}
		if named != hash {
			return stamp{}, refuse("%s is commit %s (%s), not %s: make release RELEASE_COMMIT=%s", explicit, short(named), changelogFile, short(hash), short(named))
		}
		st.Version, st.Release = explicit, true
		return st, nil
	}

	e, ok := entryOf(st.Source)
	if ok {
		named, err := namedCommit(r, e)
		switch {
		case err == nil && named == hash:
			st.Version, st.Release = st.Source, true
			return st, nil
		case err != nil:
			st.Why = err.Error()
		case versionOf(r, named) != st.Source:
			st.Why = fmt.Sprintf("%s is commit %s (%s), whose source predates versioned builds", st.Source, short(named), changelogFile)
		default:
			st.Why = fmt.Sprintf("%s is commit %s (%s), not %s: make release RELEASE_COMMIT=%s builds %s", st.Source, short(named), changelogFile, short(hash), short(named), st.Source)
		}
	} else {
		st.Why = fmt.Sprintf("%s has no entry in %s of %s", st.Source, changelogFile, changelogRev)
	}
	next, err := nextPatch(st.Source)
	if err != nil {
		return stamp{}, err
	}
	// Go's pseudo-version after a release: the next patch, pre-release 0.TIME-COMMIT.
	st.Version = fmt.Sprintf("%s-0.%s-%s", next, t.Format("20060102150405"), hash[:12])
	return st, nil
}

// versionOf is the Release of commit hash's source, "" when it has none.
func versionOf(r repo, hash string) string {
	src, err := r.show(hash, buildinfoFile)
	if err != nil {
		return ""
	}
	if m := releaseConstRE.FindStringSubmatch(src); m != nil {
		return m[1]
	}
	return ""
}

// namedCommit is the full hash of the commit a changelog entry names.
func namedCommit(r repo, e changelogEntry) (string, error) {
	if e.commit == "" {
		return "", refuse("%s's entry v%s names no commit yet: the commit after the release commit names it (docs/releasing.md#cutting-a-release)", changelogFile, e.version)
	}
	named, ok := r.commit(e.commit)
	if !ok {
		return "", refuse("%s names commit %s for v%s, which this clone does not have (fetch it)", changelogFile, e.commit, e.version)
	}
	return named, nil
}

// nextPatch is vX.Y.(Z+1).
func nextPatch(v string) (string, error) {
	m := semverRE.FindStringSubmatch(v)
	if m == nil {
		return "", fmt.Errorf("%q is not a semantic version", v)
	}
	z, _ := strconv.Atoi(m[3])
	return fmt.Sprintf("v%s.%s.%d", m[1], m[2], z+1), nil
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}
