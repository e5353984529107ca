package buildinfo

import (
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// goList asks the go command for a module's version as go.mod resolves it.
func goList(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", module).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", module, err)
	}
	return strings.TrimSpace(string(out))
}

// TestGetReportsTheModulesBuiltWith: this test binary does not link
// k8s.io/kubernetes (the CLI's tests check that its binary reports it).
func TestGetReportsTheModulesBuiltWith(t *testing.T) {
	info := Get()
	if info.Kubernetes != Unknown || info.Etcd != Unknown {
		t.Errorf("Kubernetes %q, etcd %q in a binary that links neither %s nor %s", info.Kubernetes, info.Etcd, KubernetesModule, EtcdModule)
	}
	if want := strings.TrimPrefix(goList(t, "go.etcd.io/etcd/api/v3"), "v"); info.EtcdClient != want {
		t.Errorf("EtcdClient %q, go.mod has %q", info.EtcdClient, want)
	}
	if info.Go != runtime.Version() || info.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("Go %q platform %q", info.Go, info.Platform)
	}
	if info.Version != Release || !info.Development {
		t.Errorf("version %q development %v in a test binary, want %s, a development build", info.Version, info.Development, Release)
	}
}

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{
		Main: debug.Module{Path: "kube-etcd-migrate", Version: "v0.0.0-20260101120000-0123456789ab+dirty"},
		Deps: []*debug.Module{
			{Path: "k8s.io/api", Version: "v0.36.3"},
			{Path: KubernetesModule, Version: "v1.36.0", Replace: &debug.Module{Path: KubernetesModule, Version: "v1.36.3"}},
			{Path: EtcdModule, Version: "v3.7.3"},
		},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef"},
			{Key: "vcs.time", Value: "2026-01-01T12:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	got := fromBuildInfo(bi, "", "")
	// make build / go build in a clone: the source's semantic version (not the
	// toolchain's pseudo-version), a development build, the VCS stamp.
	if got.Version != Release || !got.Development || got.Kubernetes != "v1.36.3" || got.Etcd != "v3.7.3" || got.Commit != "0123456789abcdef" || got.CommitTime != "2026-01-01T12:00:00Z" || !got.Modified {
		t.Errorf("from VCS stamp: %+v", got)
	}
	if got := fromBuildInfo(bi, "v1.2.3", ""); got.Version != "v1.2.3" || got.Development || got.Commit != "0123456789abcdef" {
		t.Errorf("-ldflags version must win: %+v", got)
	}
	// go run / go test: no module version, no VCS.
	dev := fromBuildInfo(&debug.BuildInfo{Main: debug.Module{Path: "kube-etcd-migrate", Version: "(devel)"}}, "", "")
	if dev.Version != Release || !dev.Development || dev.Kubernetes != Unknown || dev.Commit != "" {
		t.Errorf("devel build: %+v", dev)
	}
	if none := fromBuildInfo(nil, "", ""); none.Version != Release || !none.Development || none.Kubernetes != Unknown {
		t.Errorf("no build info: %+v", none)
	}
	// make release: a clean copy without VCS information, version and commit stamped.
	rel := fromBuildInfo(&debug.BuildInfo{Main: debug.Module{Path: "kube-etcd-migrate", Version: "(devel)"}}, "v1.2.3", "0123456789abcdef")
	if rel.Version != "v1.2.3" || rel.Development || rel.Commit != "0123456789abcdef" || rel.Modified {
		t.Errorf("release build: %+v", rel)
	}
	// make release of a commit that is not a release: the next version's
	// pre-release, stamped, and a development build all the same.
	dev = fromBuildInfo(&debug.BuildInfo{Main: debug.Module{Path: "kube-etcd-migrate", Version: "(devel)"}}, "v1.2.4-0.20261201120000-0123456789ab", "0123456789abcdef")
	if dev.Version != "v1.2.4-0.20261201120000-0123456789ab" || !dev.Development || dev.Commit != "0123456789abcdef" {
		t.Errorf("make release of another commit: %+v", dev)
	}
}
