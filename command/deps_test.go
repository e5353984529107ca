package command

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBinaryLinksNoRig checks what internal/testrig and internal/build
// promise: nothing under them is linked into the kube-etcd-migrate binary.
func TestBinaryLinksNoRig(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "kube-etcd-migrate").Output()
	if err != nil {
		t.Fatalf("go list -deps kube-etcd-migrate: %v", err)
	}
	var linked int
	for _, p := range strings.Fields(string(out)) {
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
