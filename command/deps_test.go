package command

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestBinaryLinksNoRig checks what internal/testrig and internal/build
// promise: nothing under them is linked into the kube-etcd-migrate binary;
// nor is etcdutl, nor is an etcd server but through kine's server package
// (which imports etcd's embed for one constant, DefaultMaxRequestBytes): no
// command runs an etcd server or restores a backup (a --snapshot-file is
// read in place, an --output-snapshot built from it).
func TestBinaryLinksNoRig(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "kube-etcd-migrate").Output()
	if err != nil {
		t.Fatalf("go list -deps kube-etcd-migrate: %v", err)
	}
	var linked int
	server := func(p string) bool {
		return p == "go.etcd.io/etcd/server/v3/embed" || p == "go.etcd.io/etcd/server/v3/etcdserver"
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p := f[0]
		if strings.HasPrefix(p, "go.etcd.io/etcd/etcdutl/") {
			t.Errorf("the binary links %s: no command restores a backup", p)
		}
		if !strings.HasPrefix(p, "go.etcd.io/etcd/server/") {
			for _, imp := range f[1:] {
				if server(imp) && p != "github.com/k3s-io/kine/pkg/server" {
					t.Errorf("%s imports %s: no command runs an etcd server", p, imp)
				}
			}
		}
		if !strings.HasPrefix(p, "kube-etcd-migrate") {
			continue
		}
		linked++
		if strings.HasPrefix(p, "kube-etcd-migrate/internal/testrig/") || p == "kube-etcd-migrate/internal/testrig" || strings.HasPrefix(p, "kube-etcd-migrate/internal/build/") || p == "kube-etcd-migrate/internal/build" {
			t.Errorf("the binary links %s, a package of the test rig or the build tools", p)
		}
	}
	if linked < 10 {
		t.Fatalf("go list -deps kube-etcd-migrate named %d of the module's packages; want the tool's whole tree", linked)
	}
}

// TestReleaseSQLiteIsPureGo: built as the release builds it (no cgo), the
// binary serves SQLite through kine with modernc.org/sqlite, the driver the
// tests run under make (CGO_ENABLED=0), and links no C SQLite
// (mattn/go-sqlite3, kine's driver with cgo).
func TestReleaseSQLiteIsPureGo(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "kube-etcd-migrate")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps kube-etcd-migrate: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "modernc.org/sqlite") {
		t.Error("built without cgo, the binary does not link modernc.org/sqlite")
	}
	for _, p := range deps {
		if strings.HasPrefix(p, "github.com/mattn/go-sqlite3") {
			t.Errorf("built without cgo, the binary links %s", p)
		}
	}
}

// TestToolModuleGraphHasNoReleaseTooling: what builds packages, images and
// SBOMs (internal/build/dist, a module of its own) is not in the tool's module
// graph, so it can neither be linked into the binary nor move, by minimal
// version selection, a module the binary links.
func TestToolModuleGraphHasNoReleaseTooling(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "all").Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	modules := strings.Fields(string(out))
	if len(modules) < 100 {
		t.Fatalf("go list -m all named %d words; want the tool's whole module graph", len(modules))
	}
	for _, m := range modules {
		for _, tooling := range []string{"github.com/goreleaser/nfpm", "github.com/google/go-containerregistry", "github.com/CycloneDX/cyclonedx-go", "github.com/google/rpmpack"} {
			if strings.HasPrefix(m, tooling) {
				t.Errorf("the tool's module graph has %s, a module of the release tooling (internal/build/dist/go.mod is its place)", m)
			}
		}
	}
}
