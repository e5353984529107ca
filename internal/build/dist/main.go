// Command dist is `make release`: it builds one commit of kube-etcd-migrate
// into the artifacts an operator installs, and names it.
//
// For each platform: the static binary, its .deb and .rpm (binary in
// /usr/bin, man page, bash and zsh completion, /var/lib/kube-etcd-migrate
// created 0700), an OCI image (the binary on an empty base) as an OCI layout
// in a tar file, and a CycloneDX SBOM of each of these from the binary's own
// build information; then SHA256SUMS over all of them. Built from `git
// archive` of the commit, never the working tree; every file's time is the
// commit's, so two builds of a commit with the same Go release are the same
// bytes.
//
// The version: the commit CHANGELOG.md names for its version is stamped with
// it; any other is a development build of the next version (version.go).
//
// It is a module of its own so that what packages and images are built with
// (nfpm, go-containerregistry, cyclonedx-go) is never in the tool's module
// graph: in the tool's go.mod, minimal version selection would move modules
// the tool links (docs/design.md, "Dependencies and why").
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cdx "github.com/CycloneDX/cyclonedx-go"
)

// options are make release's variables.
type options struct {
	repo      string // the git repository
	commit    string // RELEASE_COMMIT: what to build
	changelog string // the revision whose CHANGELOG.md names the release commits
	version   string // RELEASE_VERSION: "" for what the commit is
	out       string // DIST
	goCmd     string // GO
	platforms []platform
	check     bool // release-check: say what the build would be called, build nothing
}

func main() {
	var o options
	var platforms string
	flag.StringVar(&o.repo, "repo", ".", "the git repository")
	flag.StringVar(&o.commit, "commit", "HEAD", "the commit to build (RELEASE_COMMIT)")
	flag.StringVar(&o.changelog, "changelog", "HEAD", "the revision whose CHANGELOG.md names each release's commit")
	flag.StringVar(&o.version, "version", "", "the version to stamp (RELEASE_VERSION): refused unless CHANGELOG.md names this commit for it; empty: the commit's own")
	flag.StringVar(&o.out, "out", "dist", "the directory to write (DIST): replaced")
	flag.StringVar(&o.goCmd, "go", "go", "the go command (GO)")
	flag.StringVar(&platforms, "platforms", "linux/amd64,linux/arm64", "comma list of GOOS/GOARCH")
	flag.BoolVar(&o.check, "check", false, "say what a build of the commit is called, and build nothing")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "make release: no arguments; see docs/releasing.md")
		os.Exit(2)
	}
	var err error
	if o.platforms, err = parsePlatforms(platforms); err != nil {
		fmt.Fprintln(os.Stderr, "make release:", err)
		os.Exit(2)
	}
	if _, err := release(o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "make release:", err)
		os.Exit(1)
	}
}

// release resolves the version and, unless only checking, builds every
// artifact into o.out; it returns the stamp and the names written.
func release(o options, log io.Writer) ([]string, error) {
	r := repo{dir: o.repo}
	st, err := resolve(r, o.commit, o.changelog, o.version)
	if err != nil {
		return nil, err
	}
	if st.Release {
		fmt.Fprintf(log, "release %s: commit %s, as CHANGELOG.md names it\n", st.Version, st.Commit)
	} else {
		fmt.Fprintf(log, "development build %s of commit %s, not a release: %s\n", st.Version, st.Commit, st.Why)
	}
	if o.check {
		return nil, nil
	}
	work, err := os.MkdirTemp("", "kube-etcd-migrate-release-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	if err := r.extract(st.Commit, src); err != nil {
		return nil, err
	}
	out, err := filepath.Abs(o.out)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(out); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for _, p := range o.platforms {
		names, err := releasePlatform(o, src, work, out, p, st, log)
		if err != nil {
			return nil, err
		}
		written = append(written, names...)
	}
	sums, err := writeSums(out, written)
	if err != nil {
		return nil, err
	}
	fmt.Fprint(log, sums)
	return append(written, sumsFile), nil
}

// releasePlatform writes the binary, packages, image and SBOMs of p.
func releasePlatform(o options, src, work, out string, p platform, st stamp, log io.Writer) ([]string, error) {
	binName := fmt.Sprintf("kube-etcd-migrate-%s-%s", p.os, p.arch)
	bin := filepath.Join(out, binName)
	fmt.Fprintf(log, "building %s: %s (commit %s)\n", binName, st.Version, st.Commit)
	if err := buildBinary(o.goCmd, src, bin, p, st); err != nil {
		return nil, err
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		return nil, err
	}
	binBytes, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	pkgVersion, pre := st.packageVersion()
	if pre != "" {
		pkgVersion += "~" + pre
	}
	subjects := []subject{{file: binName, kind: cdx.ComponentTypeApplication,
		purl: fmt.Sprintf("pkg:generic/kube-etcd-migrate@%s?os=%s&arch=%s", st.Version, p.os, p.arch)}}

	pwork := filepath.Join(work, p.arch)
	if err := os.MkdirAll(pwork, 0o755); err != nil {
		return nil, err
	}
	for _, format := range []string{"deb", "rpm"} {
		contents, err := packageFiles(bin, pwork, src, st)
		if err != nil {
			return nil, err
		}
		name, err := writePackage(format, out, contents, p, st)
		if err != nil {
			return nil, err
		}
		purl := fmt.Sprintf("pkg:deb/kube-etcd-migrate@%s?arch=%s", pkgVersion, p.arch)
		if format == "rpm" {
			purl = fmt.Sprintf("pkg:rpm/kube-etcd-migrate@%s-1?arch=%s", pkgVersion, rpmArch(p))
		}
		subjects = append(subjects, subject{file: name, kind: cdx.ComponentTypeApplication, purl: purl})
		fmt.Fprintf(log, "packaged %s\n", name)
	}
	imageFile, err := writeImage(out, pwork, binBytes, p, st)
	if err != nil {
		return nil, err
	}
	subjects = append(subjects, subject{file: imageFile, kind: cdx.ComponentTypeContainer,
		purl: fmt.Sprintf("pkg:oci/kube-etcd-migrate?arch=%s&repository_url=%s&tag=%s", p.arch, imageRepo, st.Version)})
	fmt.Fprintf(log, "image %s (%s)\n", imageFile, imageName(st))

	var names []string
	for _, s := range subjects {
		sbom, err := writeSBOM(out, s, bin, st)
		if err != nil {
			return nil, err
		}
		names = append(names, s.file, sbom)
	}
	return names, nil
}

func rpmArch(p platform) string {
	if p.arch == "amd64" {
		return "x86_64"
	}
	return "aarch64"
}

const sumsFile = "SHA256SUMS"

// writeSums writes SHA256SUMS over the named files, as sha256sum prints
// them (sorted by name), and returns it.
func writeSums(dir string, names []string) (string, error) {
	names = slices.Sorted(slices.Values(names))
	var b strings.Builder
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(data)
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), n)
	}
	return b.String(), os.WriteFile(filepath.Join(dir, sumsFile), []byte(b.String()), 0o644)
}
