package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// platform is a GOOS/GOARCH a release is built for.
type platform struct{ os, arch string }

func parsePlatforms(list string) ([]platform, error) {
	var out []platform
	for _, p := range strings.Split(list, ",") {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos != "linux" || (goarch != "amd64" && goarch != "arm64") {
			return nil, fmt.Errorf("platform %q: want linux/amd64 or linux/arm64", p)
		}
		out = append(out, platform{goos, goarch})
	}
	return out, nil
}

func (p platform) String() string { return p.os + "/" + p.arch }

// The module path of the tool, whose internal/buildinfo the build stamps.
const buildinfoPkg = "kube-etcd-migrate/internal/buildinfo"

// ldflags stamp the version and the commit into internal/buildinfo, and drop
// the symbol table and DWARF (-s -w), as the release always has.
func ldflags(st stamp) string {
	return "-s -w -X " + buildinfoPkg + ".version=" + st.Version + " -X " + buildinfoPkg + ".commit=" + st.Commit
}

// buildBinary builds the tool of the source tree src for p into out: static
// (no cgo), -trimpath (no path of this machine), no VCS stamp (the commit is
// stamped instead), with every setting that changes the code the toolchain
// would otherwise take from the environment set to its default, so that two
// builds of a commit with the same Go release give the same bytes.
func buildBinary(goCmd, src, out string, p platform, st stamp) error {
	cmd := exec.Command(goCmd, "build", "-trimpath", "-buildvcs=false", "-mod=readonly", "-ldflags", ldflags(st), "-o", out, ".")
	cmd.Dir = src
	cmd.Env = buildEnv(p)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %v\n%s", p, err, stderr.String())
	}
	return nil
}

// buildEnv is this process's environment with what decides the code built
// set: the platform, no cgo, no GOFLAGS, the baseline instruction sets, no
// experiments.
func buildEnv(p platform) []string {
	set := map[string]string{
		"GOOS":         p.os,
		"GOARCH":       p.arch,
		"CGO_ENABLED":  "0",
		"GOFLAGS":      "",
		"GOAMD64":      "v1",
		"GOARM64":      "v8.0",
		"GOEXPERIMENT": "",
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}
