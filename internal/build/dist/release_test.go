package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/blakesmith/ar"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sassoftware/go-rpmutils"
)

// The release tests build the project's own HEAD once, for this machine's
// platform only (the other platform is the same code cross-compiled: building
// it too would double the test's time), and check every artifact of that one
// build; the reproducibility test builds it a second time.

// root is the repository, from this package's directory (tests run there).
const root = "../../.."

var host = platform{"linux", runtime.GOARCH}

type built struct {
	dir   string
	st    stamp
	names []string
	err   error
}

var (
	once     sync.Once
	first    built
	tempDirs []string
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range tempDirs {
		os.RemoveAll(d)
	}
	os.Exit(code)
}

// buildRelease runs make release's tool on commit for the host platform
// into a new directory.
func buildRelease(commit string) built {
	dir, err := os.MkdirTemp("", "kube-etcd-migrate-release-test-")
	if err != nil {
		return built{err: err}
	}
	tempDirs = append(tempDirs, dir)
	var log bytes.Buffer
	o := options{repo: root, commit: commit, changelog: "HEAD", out: filepath.Join(dir, "dist"), goCmd: "go", platforms: []platform{host}}
	names, err := release(o, &log)
	if err != nil {
		return built{err: fmt.Errorf("%v\n%s", err, log.String())}
	}
	st, err := resolve(repo{dir: root}, commit, "HEAD", "")
	return built{dir: o.out, st: st, names: names, err: err}
}

// theRelease is the one build the tests check.
func theRelease(t *testing.T) built {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the release: not in -short")
	}
	once.Do(func() {
		head, ok := repo{dir: root}.commit("HEAD")
		if !ok {
			first.err = fmt.Errorf("%s is not a git checkout", root)
			return
		}
		first = buildRelease(head)
	})
	if first.err != nil {
		t.Fatal(first.err)
	}
	return first
}

func (b built) path(name string) string { return filepath.Join(b.dir, name) }

func (b built) binName() string { return "kube-etcd-migrate-" + host.os + "-" + host.arch }

func (b built) read(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(b.path(name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestReleaseArtifactsAndSums: the binary, the deb, the rpm, the image and an
// SBOM of each, and SHA256SUMS over all of them, each line sha256sum's.
func TestReleaseArtifactsAndSums(t *testing.T) {
	b := theRelease(t)
	v, pre := b.st.packageVersion()
	if pre != "" {
		v += "~" + pre
	}
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[host.arch]
	artifacts := []string{
		b.binName(),
		fmt.Sprintf("kube-etcd-migrate_%s_%s.deb", v, host.arch),
		fmt.Sprintf("kube-etcd-migrate-%s-1.%s.rpm", v, rpmArch),
		b.binName() + ".oci.tar",
	}
	var want []string
	for _, a := range artifacts {
		want = append(want, a, a+".cdx.json")
	}
	want = append(want, "SHA256SUMS")
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the release directory holds\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	var lines []string
	for _, name := range want {
		if name != "SHA256SUMS" {
			lines = append(lines, sha256Hex(b.read(t, name))+"  "+name)
		}
	}
	if sums := string(b.read(t, "SHA256SUMS")); sums != strings.Join(lines, "\n")+"\n" {
		t.Errorf("SHA256SUMS:\n%s\nwant:\n%s", sums, strings.Join(lines, "\n"))
	}
	if _, err := exec.LookPath("sha256sum"); err == nil {
		cmd := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
		cmd.Dir = b.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sha256sum --check: %v\n%s", err, out)
		}
	}
}

// versionJSON is what `version -o json` reports.
type versionJSON struct {
	Version     string `json:"version"`
	Development bool   `json:"development"`
	Commit      string `json:"commit"`
	Kubernetes  string `json:"kubernetes"`
	Etcd        string `json:"etcd"`
	Go          string `json:"go"`
	Platform    string `json:"platform"`
}

// runVersion runs bin version -o json.
func runVersion(t *testing.T, bin string) versionJSON {
	t.Helper()
	out, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("%s version -o json: %v", bin, err)
	}
	var v versionJSON
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s version -o json: %v\n%s", bin, err, out)
	}
	return v
}

// linked is the version of module path the binary links (a replace's).
func linked(t *testing.T, bin, path string) string {
	t.Helper()
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	t.Fatalf("%s does not link %s", bin, path)
	return ""
}

// TestReleaseBinary: static, built -trimpath without cgo for its platform,
// stamped with the version and commit it reports, naming the Kubernetes, etcd
// and Go it links, and holding no path of the machine that built it.
func TestReleaseBinary(t *testing.T) {
	b := theRelease(t)
	bin := b.path(b.binName())
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("%s is dynamically linked (program header %v)", b.binName(), p.Type)
		}
	}
	f.Close()
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true", "GOOS": host.os, "GOARCH": host.arch} {
		if settings[k] != want {
			t.Errorf("build setting %s=%q, want %q", k, settings[k], want)
		}
	}
	if _, ok := settings["vcs.revision"]; ok {
		t.Error("the release binary has a VCS stamp: it is built from git archive, the commit stamped instead")
	}
	v := runVersion(t, bin)
	if v.Version != b.st.Version || v.Development == b.st.Release || v.Commit != b.st.Commit {
		t.Errorf("version -o json: %+v, want version %s, development %v, commit %s", v, b.st.Version, !b.st.Release, b.st.Commit)
	}
	if v.Kubernetes != linked(t, bin, "k8s.io/kubernetes") || v.Etcd != linked(t, bin, "go.etcd.io/etcd/server/v3") || v.Go != bi.GoVersion || v.Platform != host.String() {
		t.Errorf("version -o json: %+v: want the Kubernetes, etcd and Go versions the binary links", v)
	}
	data := b.read(t, b.binName())
	abs, _ := filepath.Abs(root)
	for _, leak := range []string{abs, os.TempDir() + "/kube-etcd-migrate-release-"} {
		if bytes.Contains(data, []byte(leak)) {
			t.Errorf("the binary holds the path %s of the machine that built it", leak)
		}
	}
}

// debMembers are the ar members of a deb.
func debMembers(t *testing.T, deb []byte) map[string][]byte {
	t.Helper()
	members := map[string][]byte{}
	r := ar.NewReader(bytes.NewReader(deb))
	var order []string
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		members[name] = body
		order = append(order, name)
	}
	if !slices.Equal(order, []string{"debian-binary", "control.tar.gz", "data.tar.gz"}) {
		t.Fatalf("deb members %v", order)
	}
	return members
}

// tarEntry is a file of a tar archive.
type tarEntry struct {
	hdr  *tar.Header
	body []byte
}

func readTar(t *testing.T, r io.Reader) map[string]tarEntry {
	t.Helper()
	out := map[string]tarEntry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(strings.TrimPrefix(h.Name, "./"), "/")] = tarEntry{h, body}
	}
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sourceFile is a file of the commit the release was built from.
func sourceFile(t *testing.T, b built, path string) []byte {
	t.Helper()
	s, err := repo{dir: root}.show(b.st.Commit, path)
	if err != nil {
		t.Fatal(err)
	}
	return []byte(s + "\n")
}

// TestDebInstallsAndRuns: the deb's control names the package, version and
// architecture; it holds the binary, the man page, bash and zsh completion
// and the state directory with their modes, owned by root, each with the
// commit's time; installed into a scratch root, the binary runs from there
// and says what it is, and bash loads the completion.
func TestDebInstallsAndRuns(t *testing.T) {
	b := theRelease(t)
	v, pre := b.st.packageVersion()
	if pre != "" {
		v += "~" + pre
	}
	debName := fmt.Sprintf("kube-etcd-migrate_%s_%s.deb", v, host.arch)
	members := debMembers(t, b.read(t, debName))
	if string(members["debian-binary"]) != "2.0\n" {
		t.Errorf("debian-binary %q", members["debian-binary"])
	}
	control := string(readTar(t, bytes.NewReader(gunzip(t, members["control.tar.gz"])))["control"].body)
	for _, field := range []string{"Package: kube-etcd-migrate\n", "Version: " + v + "\n", "Architecture: " + host.arch + "\n", "Section: admin\n"} {
		if !strings.Contains(control, field) {
			t.Errorf("control lacks %q:\n%s", field, control)
		}
	}
	if strings.Contains(control, "Depends:") {
		t.Errorf("a static binary depends on nothing:\n%s", control)
	}
	data := readTar(t, bytes.NewReader(gunzip(t, members["data.tar.gz"])))
	binary := b.read(t, b.binName())
	wantFiles := map[string]struct {
		mode int64
		dir  bool
		body []byte
	}{
		"usr/bin/kube-etcd-migrate":                               {0o755, false, binary},
		"usr/share/man/man1/kube-etcd-migrate.1.gz":               {0o644, false, nil},
		"usr/share/bash-completion/completions/kube-etcd-migrate": {0o644, false, sourceFile(t, b, srcBash)},
		"usr/share/zsh/vendor-completions/_kube-etcd-migrate":     {0o644, false, sourceFile(t, b, srcZsh)},
		"var/lib/kube-etcd-migrate":                               {0o700, true, nil},
	}
	for name, want := range wantFiles {
		e, ok := data[name]
		if !ok {
			t.Errorf("the deb has no %s", name)
			continue
		}
		if e.hdr.Mode&0o7777 != want.mode || (e.hdr.Typeflag == tar.TypeDir) != want.dir || e.hdr.Uid != 0 || e.hdr.Gid != 0 || e.hdr.Uname != "root" || !e.hdr.ModTime.Equal(b.st.Time) {
			t.Errorf("%s: mode %o type %c owner %d/%d %s time %v; want mode %o, dir %v, root, %v", name, e.hdr.Mode, e.hdr.Typeflag, e.hdr.Uid, e.hdr.Gid, e.hdr.Uname, e.hdr.ModTime, want.mode, want.dir, b.st.Time)
		}
		if want.body != nil && !bytes.Equal(e.body, want.body) {
			t.Errorf("%s is not the release's file", name)
		}
	}
	if man := gunzip(t, data["usr/share/man/man1/kube-etcd-migrate.1.gz"].body); !bytes.Equal(man, sourceFile(t, b, srcManPage)) {
		t.Error("the deb's man page is not packaging/kube-etcd-migrate.1 of the commit")
	}
	for name, e := range data {
		if e.hdr.Typeflag == tar.TypeReg {
			if _, ok := wantFiles[name]; !ok {
				t.Errorf("the deb installs %s too", name)
			}
		}
	}

	// Install: the data archive into a scratch root, as dpkg unpacks it.
	scratchRoot := t.TempDir()
	for name, e := range data {
		p := filepath.Join(scratchRoot, name)
		switch e.hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(e.hdr.Mode)&0o777); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, e.body, os.FileMode(e.hdr.Mode)&0o777); err != nil {
				t.Fatal(err)
			}
		}
	}
	installed := filepath.Join(scratchRoot, "usr/bin/kube-etcd-migrate")
	if v := runVersion(t, installed); v.Version != b.st.Version || v.Commit != b.st.Commit {
		t.Errorf("the installed binary says %+v, want %s of %s", v, b.st.Version, b.st.Commit)
	}
	fi, err := os.Stat(filepath.Join(scratchRoot, "var/lib/kube-etcd-migrate"))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("installed state directory: %v %v", fi, err)
	}
	script := "source " + filepath.Join(scratchRoot, "usr/share/bash-completion/completions/kube-etcd-migrate") + "\ncomplete -p kube-etcd-migrate"
	out, err := exec.Command("bash", "-c", script).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "-F _cli_bash_autocomplete kube-etcd-migrate") {
		t.Errorf("bash did not load the installed completion: %v\n%s", err, out)
	}
}

// TestRPMContents: the rpm's header names the package, version, release and
// architecture; its files are the deb's, zsh's in Fedora's place, with their
// modes and owners; the state directory is the package's, 0700; the binary in
// its payload is the release's.
func TestRPMContents(t *testing.T) {
	b := theRelease(t)
	v, pre := b.st.packageVersion()
	if pre != "" {
		v += "~" + pre
	}
	rpmArch := map[string]string{"amd64": "x86_64", "arm64": "aarch64"}[host.arch]
	f, err := os.Open(b.path(fmt.Sprintf("kube-etcd-migrate-%s-1.%s.rpm", v, rpmArch)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rpm, err := rpmutils.ReadRpm(f)
	if err != nil {
		t.Fatal(err)
	}
	nevra, err := rpm.Header.GetNEVRA()
	if err != nil {
		t.Fatal(err)
	}
	if nevra.Name != "kube-etcd-migrate" || nevra.Version != v || nevra.Release != "1" || nevra.Arch != rpmArch {
		t.Errorf("rpm %+v, want kube-etcd-migrate %s-1 %s", nevra, v, rpmArch)
	}
	files, err := rpm.Header.GetFiles()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]rpmutils.FileInfo{}
	for _, fi := range files {
		got[fi.Name()] = fi
	}
	want := map[string]int{
		binPath:    0o100755,
		manPath:    0o100644,
		bashPath:   0o100644,
		zshRPMPath: 0o100644,
		stateDir:   0o40700,
	}
	if len(got) != len(want) {
		t.Errorf("the rpm owns %d files, want %d (no directory it does not create): %v", len(got), len(want), slices.Sorted(maps.Keys(got)))
	}
	for name, mode := range want {
		fi, ok := got[name]
		if !ok {
			t.Errorf("the rpm has no %s", name)
			continue
		}
		if fi.Mode() != mode || fi.UserName() != "root" || fi.GroupName() != "root" || int64(fi.Mtime()) != b.st.Time.Unix() {
			t.Errorf("%s: mode %o %s/%s time %d, want %o root/root %d", name, fi.Mode(), fi.UserName(), fi.GroupName(), fi.Mtime(), mode, b.st.Time.Unix())
		}
	}
	payload, err := rpm.PayloadReaderExtended()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for {
		fi, err := payload.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if fi.Name() != binPath {
			continue
		}
		body, err := io.ReadAll(payload)
		if err != nil {
			t.Fatal(err)
		}
		found = bytes.Equal(body, b.read(t, b.binName()))
	}
	if !found {
		t.Errorf("the rpm's payload does not hold the release's binary at %s", binPath)
	}
}

// TestImage: the OCI layout names the image localhost/kube-etcd-migrate:VERSION
// for containerd and podman; its config runs the binary as a non-root user by
// default, with the version and commit as labels; its one layer holds the
// release's binary, /tmp and the state directory's mount point.
func TestImage(t *testing.T) {
	b := theRelease(t)
	dir := t.TempDir()
	f, err := os.Open(b.path(b.binName() + ".oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := untar(f, dir); err != nil {
		t.Fatal(err)
	}
	f.Close()
	lp, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d images in the layout, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	name := "localhost/kube-etcd-migrate:" + b.st.Version
	if desc.Annotations["org.opencontainers.image.ref.name"] != name || desc.Annotations["io.containerd.image.name"] != name ||
		desc.Platform == nil || desc.Platform.OS != host.os || desc.Platform.Architecture != host.arch || desc.MediaType != types.OCIManifestSchema1 {
		t.Errorf("index entry %+v, want %s for %s, an OCI manifest", desc, name, host)
	}
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != host.os || cf.Architecture != host.arch || !slices.Equal(cf.Config.Entrypoint, []string{"/usr/bin/kube-etcd-migrate"}) ||
		cf.Config.User != "65532:65532" || !cf.Created.Time.Equal(b.st.Time) {
		t.Errorf("image config %+v, created %v", cf.Config, cf.Created)
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != b.st.Version || cf.Config.Labels["org.opencontainers.image.revision"] != b.st.Commit {
		t.Errorf("image labels %v, want version %s and revision %s", cf.Config.Labels, b.st.Version, b.st.Commit)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("layer media type %s", mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	entries := readTar(t, rc)
	rc.Close()
	for path, want := range map[string]struct {
		mode     int64
		uid      int
		typeflag byte
	}{
		"usr/bin/kube-etcd-migrate": {0o755, 0, tar.TypeReg},
		"tmp":                       {0o1777, 0, tar.TypeDir},
		"var/lib/kube-etcd-migrate": {0o700, 65532, tar.TypeDir},
	} {
		e, ok := entries[path]
		if !ok {
			t.Errorf("the layer has no /%s", path)
			continue
		}
		if e.hdr.Mode != want.mode || e.hdr.Uid != want.uid || e.hdr.Typeflag != want.typeflag || !e.hdr.ModTime.Equal(b.st.Time) {
			t.Errorf("/%s: mode %o uid %d type %c time %v", path, e.hdr.Mode, e.hdr.Uid, e.hdr.Typeflag, e.hdr.ModTime)
		}
	}
	if !bytes.Equal(entries["usr/bin/kube-etcd-migrate"].body, b.read(t, b.binName())) {
		t.Error("the image's binary is not the release's")
	}
}

// TestSBOMs: each artifact's SBOM is CycloneDX JSON describing that artifact
// (its sha256), the binary in it, and exactly the modules the binary links,
// at the versions it links, with the Go release.
func TestSBOMs(t *testing.T) {
	b := theRelease(t)
	bin := b.path(b.binName())
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	var wantModules []string
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		wantModules = append(wantModules, m.Path+"@"+m.Version)
	}
	sort.Strings(wantModules)
	binSum := sha256Hex(b.read(t, b.binName()))
	for _, name := range b.names {
		if !strings.HasSuffix(name, ".cdx.json") {
			continue
		}
		artifact := strings.TrimSuffix(name, ".cdx.json")
		var bom cdx.BOM
		if err := cdx.NewBOMDecoder(bytes.NewReader(b.read(t, name)), cdx.BOMFileFormatJSON).Decode(&bom); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mc := bom.Metadata.Component
		if bom.BOMFormat != "CycloneDX" || mc == nil || mc.Name != artifact || mc.Hashes == nil || (*mc.Hashes)[0].Value != sha256Hex(b.read(t, artifact)) {
			t.Errorf("%s does not describe %s by its sha256: %+v", name, artifact, mc)
			continue
		}
		var modules []string
		binaryFound := artifact == b.binName()
		goFound := false
		for _, c := range *bom.Components {
			switch {
			case c.Type == cdx.ComponentTypeLibrary && c.Name == "stdlib":
				goFound = c.Version == bi.GoVersion
			case c.Type == cdx.ComponentTypeLibrary:
				modules = append(modules, c.Name+"@"+c.Version)
			case c.Name == "kube-etcd-migrate" && c.Hashes != nil && (*c.Hashes)[0].Value == binSum:
				binaryFound = true
			}
		}
		sort.Strings(modules)
		if !slices.Equal(modules, wantModules) || !binaryFound || !goFound {
			t.Errorf("%s: the binary %v, Go %v, %d modules, want the %d the binary links", name, binaryFound, goFound, len(modules), len(wantModules))
		}
		for _, must := range []string{"k8s.io/kubernetes@" + linked(t, bin, "k8s.io/kubernetes"), "go.etcd.io/etcd/server/v3@" + linked(t, bin, "go.etcd.io/etcd/server/v3")} {
			if !slices.Contains(modules, must) {
				t.Errorf("%s does not list %s", name, must)
			}
		}
		for _, heavy := range []string{"github.com/goreleaser/nfpm/v2", "github.com/google/go-containerregistry", "github.com/CycloneDX/cyclonedx-go"} {
			if slices.ContainsFunc(modules, func(m string) bool { return strings.HasPrefix(m, heavy+"@") }) {
				t.Errorf("the tool links %s, a module of the release tooling", heavy)
			}
		}
	}
}

// TestReproducible: a second build of the same commit, from another copy of
// its tree in another directory, gives the same bytes for every artifact.
// (Its packages are compiled again only where the build cache does not hold
// them: what this proves is that nothing of the build's place or time gets
// in.)
func TestReproducible(t *testing.T) {
	b := theRelease(t)
	second := buildRelease(b.st.Commit)
	if second.err != nil {
		t.Fatal(second.err)
	}
	if a, c := string(b.read(t, "SHA256SUMS")), string(second.read(t, "SHA256SUMS")); a != c {
		t.Errorf("two builds of %s differ:\n%s\n%s", b.st.Commit, a, c)
	}
}
