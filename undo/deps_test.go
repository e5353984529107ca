package undo

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestWritersArePeers: the commands' stages that write (migrate, quarantine,
// storagemigration, plan, rollback) stand above the undo and the guards
// and reach its journal (undo) and their preflight and space guard (guard),
// never through one another: quarantine imports none of them; the undo
// imports neither the guards nor any stage or command, and the guards no
// stage or command.
// plan and storagemigration import migrate for the stage itself (a dry run,
// a migration of one resource).
func TestWritersArePeers(t *testing.T) {
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", "kube-etcd-migrate/"+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	peers := []string{"migrate", "quarantine", "storagemigration", "plan", "rollback", "writerun", "command"}
	for _, p := range append(peers, "guard") {
		if slices.Contains(deps("undo"), "kube-etcd-migrate/"+p) {
			t.Errorf("undo imports %s, a package above it", p)
		}
	}
	for _, p := range peers {
		if slices.Contains(deps("guard"), "kube-etcd-migrate/"+p) {
			t.Errorf("guard imports %s, a package above it", p)
		}
	}
	q := deps("quarantine")
	if !slices.Contains(q, "kube-etcd-migrate/undo") {
		t.Fatal("quarantine does not reach undo: the check below proves nothing")
	}
	for _, p := range peers {
		if p != "quarantine" && slices.Contains(q, "kube-etcd-migrate/"+p) {
			t.Errorf("quarantine imports %s, a peer", p)
		}
	}
	if slices.Contains(deps("migrate"), "kube-etcd-migrate/plan") || slices.Contains(deps("migrate"), "kube-etcd-migrate/storagemigration") {
		t.Error("migrate imports a package that uses it")
	}
}
