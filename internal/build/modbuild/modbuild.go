// Package modbuild builds a program of another release, from that release's own
// Go module on the module proxy and outside this module's go.mod: another
// Kubernetes release's kube-apiserver, an older etcd server. The tests use such
// binaries to play the cluster the tool meets (what a previous release really
// wrote, what it accepts back), so that nothing of the tool's own code, nor the
// release the tool links, stands in for them.
//
// Each binary is built once per machine into a cache directory (KEM_RELEASE_BIN,
// else the user cache directory) keyed by what was built, under a file lock, so
// that test binaries running in parallel and later runs share it.
package modbuild

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// Spec is one program to build.
type Spec struct {
	// Name names the binary and its cache directory, e.g. "kube-apiserver-v1.36.3".
	Name string
	// Require are the modules (path -> version) the throw-away module requires.
	Require map[string]string
	// Replace are module replacements (path -> version of the same path).
	Replace map[string]string
	// Package is the main package to build, e.g. "k8s.io/kubernetes/cmd/kube-apiserver".
	Package string
	// LDFlags are passed to go build -ldflags (version stamps).
	LDFlags string
	// Files are source files of the throwaway module (path -> content),
	// for a Package of its own ("kem-release-build/DIR"): a program run
	// against that release's code, such as a generator.
	Files map[string]string
}

// CacheDir is where built binaries are kept: $KEM_RELEASE_BIN, else
// <user cache dir>/kube-etcd-migrate/releases.
func CacheDir() (string, error) {
	if d := os.Getenv("KEM_RELEASE_BIN"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for release binaries (set KEM_RELEASE_BIN): %w", err)
	}
	return filepath.Join(base, "kube-etcd-migrate", "releases"), nil
}

// key identifies what a Spec builds (and the Go toolchain that builds it).
func (s Spec) key() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%s\n%s\n", s.Name, s.Package, s.LDFlags, goVersion())
	maps := []map[string]string{s.Require, s.Replace}
	if len(s.Files) > 0 { // (keys of specs without files stay what they were)
		maps = append(maps, s.Files)
	}
	for _, m := range maps {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(h, "%s %s\n", k, m[k])
		}
		h.Write([]byte("--\n"))
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func goVersion() string {
	out, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// Build returns the path of the built binary, building it first unless a
// previous build of the same Spec is in the cache. Concurrent callers (other
// test binaries) wait for one build.
func Build(ctx context.Context, s Spec) (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, s.Name+"-"+s.key())
	bin := filepath.Join(dir, s.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("build %s: %w", s.Name, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("build %s: %w", s.Name, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("build %s: lock %s: %w", s.Name, lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(filepath.Join(dir, ".done")); err == nil {
		return bin, nil
	}
	src := filepath.Join(dir, "src")
	if err := os.RemoveAll(src); err != nil {
		return "", err
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	var mod strings.Builder
	fmt.Fprintf(&mod, "module kem-release-build\n\ngo 1.26.0\n")
	for _, block := range []struct {
		verb string
		m    map[string]string
		line func(k, v string) string
	}{
		{"require", s.Require, func(k, v string) string { return k + " " + v }},
		{"replace", s.Replace, func(k, v string) string { return k + " => " + k + " " + v }},
	} {
		if len(block.m) == 0 {
			continue
		}
		keys := make([]string, 0, len(block.m))
		for k := range block.m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintf(&mod, "\n%s (\n", block.verb)
		for _, k := range keys {
			fmt.Fprintf(&mod, "\t%s\n", block.line(k, block.m[k]))
		}
		mod.WriteString(")\n")
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte(mod.String()), 0o644); err != nil {
		return "", err
	}
	if len(s.Files) == 0 {
		tools := fmt.Sprintf("//go:build tools\n\npackage tools\n\nimport _ %q\n", s.Package)
		if err := os.WriteFile(filepath.Join(src, "tools.go"), []byte(tools), 0o644); err != nil {
			return "", err
		}
	}
	for name, content := range s.Files {
		file := filepath.Join(src, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	args := []string{"build", "-trimpath", "-o", bin}
	if s.LDFlags != "" {
		args = append(args, "-ldflags", s.LDFlags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, s.Package)...)
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build %s (%s in %s): %v\n%s", s.Name, s.Package, src, err, tail(out.String(), 4000))
	}
	if err := os.WriteFile(filepath.Join(dir, ".done"), nil, 0o644); err != nil {
		return "", err
	}
	return bin, nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// KubeAPIServer is the Spec of kube-apiserver at Kubernetes release version
// (e.g. "v1.36.3"): k8s.io/kubernetes at that version with every staging
// module its go.mod points at ./staging replaced by the module proxy's
// v0.MINOR.PATCH, stamped with the version as a release build is.
func KubeAPIServer(ctx context.Context, version string) (Spec, error) {
	return kubernetesBinary(ctx, version, "kube-apiserver")
}

// Kubectl is the Spec of kubectl at Kubernetes release version, built as
// KubeAPIServer is: the kubectl an operator of that release runs.
func Kubectl(ctx context.Context, version string) (Spec, error) {
	return kubernetesBinary(ctx, version, "kubectl")
}

// kubernetesBinary is the Spec of k8s.io/kubernetes/cmd/NAME at release
// version.
func kubernetesBinary(ctx context.Context, version, name string) (Spec, error) {
	staging, err := stagingModules(ctx, version)
	if err != nil {
		return Spec{}, err
	}
	var major, minor, patch int
	if _, err := fmt.Sscanf(version, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		return Spec{}, fmt.Errorf("%s %q: want vMAJOR.MINOR.PATCH", name, version)
	}
	stagingVersion := fmt.Sprintf("v0.%d.%d", minor, patch)
	replace := map[string]string{}
	for _, m := range staging {
		replace[m] = stagingVersion
	}
	var ld []string
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		ld = append(ld,
			fmt.Sprintf("-X %s.gitVersion=%s", pkg, version),
			fmt.Sprintf("-X %s.gitMajor=%d", pkg, major),
			fmt.Sprintf("-X %s.gitMinor=%d", pkg, minor),
			fmt.Sprintf("-X %s.gitTreeState=clean", pkg))
	}
	return Spec{
		Name:    name + "-" + version,
		Require: map[string]string{"k8s.io/kubernetes": version},
		Replace: replace,
		Package: "k8s.io/kubernetes/cmd/" + name,
		LDFlags: strings.Join(ld, " "),
	}, nil
}

// Etcd is the Spec of the etcd server at version (e.g. "v3.6.16"), built
// from go.etcd.io/etcd/server/v3, whose main package is the etcd binary.
func Etcd(version string) Spec {
	return Spec{
		Name:    "etcd-" + version,
		Require: map[string]string{"go.etcd.io/etcd/server/v3": version},
		Package: "go.etcd.io/etcd/server/v3",
	}
}

// Etcdutl is the Spec of etcdutl at version (e.g. "v3.6.16"), the offline
// tool of that etcd release (snapshot restore), from go.etcd.io/etcd/etcdutl/v3.
func Etcdutl(version string) Spec {
	return Spec{
		Name:    "etcdutl-" + version,
		Require: map[string]string{"go.etcd.io/etcd/etcdutl/v3": version},
		Package: "go.etcd.io/etcd/etcdutl/v3",
	}
}

// stagingModules lists the modules k8s.io/kubernetes@version replaces with
// ./staging directories, from its own go.mod.
func stagingModules(ctx context.Context, version string) ([]string, error) {
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", "k8s.io/kubernetes@"+version)
	dl.Dir, dl.Env = os.TempDir(), append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := dl.Output()
	if err != nil {
		return nil, fmt.Errorf("download k8s.io/kubernetes@%s: %w", version, err)
	}
	var got struct{ GoMod, Error string }
	if err := json.Unmarshal(out, &got); err != nil || got.GoMod == "" {
		return nil, fmt.Errorf("download k8s.io/kubernetes@%s: %s %v", version, got.Error, err)
	}
	out, err = exec.CommandContext(ctx, "go", "mod", "edit", "-json", got.GoMod).Output()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", got.GoMod, err)
	}
	var gomod struct {
		Replace []struct {
			Old struct{ Path string }
			New struct{ Path string }
		}
	}
	if err := json.Unmarshal(out, &gomod); err != nil {
		return nil, fmt.Errorf("read %s: %w", got.GoMod, err)
	}
	var mods []string
	for _, r := range gomod.Replace {
		if strings.HasPrefix(r.New.Path, "./staging/") {
			mods = append(mods, r.Old.Path)
		}
	}
	if len(mods) == 0 {
		return nil, fmt.Errorf("k8s.io/kubernetes@%s: its go.mod replaces no staging module", version)
	}
	return mods, nil
}
