package command

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	tgt "kube-etcd-migrate/target"
)

// kubeadmConfig is kubeadm's kube-system/kubeadm-config ConfigMap as kubeadm
// 1.3x writes it, with the release it installed.
func kubeadmConfig(version string) *api.ConfigMap {
	return &api.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: "kube-system", UID: "uid-kubeadm-config", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Data:       map[string]string{"ClusterConfiguration": "apiServer: {}\napiVersion: kubeadm.k8s.io/v1beta4\ncertificatesDir: /etc/kubernetes/pki\nclusterName: kubernetes\nkind: ClusterConfiguration\nkubernetesVersion: " + version + "\nnetworking:\n  serviceSubnet: 10.96.0.0/12\n"},
	}
}

// TestTargetRelease: migrate writes only for a release something named (the
// tool's --target-version, the manifest's image, kubeadm's ClusterConfiguration
// in etcd), refuses with exit 2 and writes nothing otherwise, and refuses
// evidence that contradicts the target; verify states the release it judged
// for and where that came from.
func TestTargetRelease(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	ep := c.Srv.Endpoint
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	c.Put("/registry/configmaps/ns1/app", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "app"), "", "", "")
	revision := func() int64 {
		rev, err := c.Srv.Revision(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	target := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := runCLI(t, append([]string{"verify", "-o", "json", "--endpoints", ep}, args...)...)
		if code != 3 {
			t.Fatalf("verify %v: exit %d, want 3 (a stale DeviceClass)\n%s", args, code, stderr)
		}
		var rep struct{ Target string }
		if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
			t.Fatal(err)
		}
		return rep.Target
	}

	// Nothing says which release: migrate refuses, verify assumes the newest.
	before := revision()
	code, _, stderr := runCLI(t, "migrate", "--endpoints", ep)
	if code != exitUsage || !strings.Contains(stderr, "which Kubernetes release") || !strings.Contains(stderr, "--target-version (one of 1.34, 1.35, 1.36, 1.37)") || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("migrate without a release: exit %d, stderr %q; want exit 2 naming --target-version", code, stderr)
	}
	if after := revision(); after != before {
		t.Errorf("the refused migrate wrote (revision %d -> %d)", before, after)
	}
	if got := target(); got != "kube-apiserver 1.37 (protobuf; release assumed: nothing said which the cluster runs)" {
		t.Errorf("verify without a release: target %q", got)
	}
	if code, _, stderr := runCLI(t, "migrate", "--endpoints", ep, "--dry-run"); code != exitOK || !strings.Contains(stderr, "assumed") {
		t.Errorf("migrate --dry-run without a release: exit %d, stderr %q; want 0 and the assumption stated", code, stderr)
	}

	// The tool's flag; out of range or malformed is a usage error naming the range.
	if got := target("--target-version", "1.36"); got != "kube-apiserver 1.36 (protobuf; release from the command line)" {
		t.Errorf("--target-version 1.36: target %q", got)
	}
	for _, bad := range []string{"1.33", "1.38", "one"} {
		code, _, stderr := runCLI(t, "verify", "--endpoints", ep, "--target-version", bad)
		if code != exitUsage || !strings.Contains(stderr, "1.34..1.37") {
			t.Errorf("--target-version %s: exit %d, stderr %q; want exit 2 with the range", bad, code, stderr)
		}
	}

	// The manifest's image says it; a --target-version of another minor
	// contradicts it; an image newer than the tool is refused.
	manifest := kubeadmManifest(t, ep)
	if got := target("--apiserver-manifest", manifest); got != "kube-apiserver 1.37 (protobuf; release from the manifest image)" {
		t.Errorf("manifest of a 1.37.2 image: target %q", got)
	}
	code, _, stderr = runCLI(t, "migrate", "--apiserver-manifest", manifest, "--target-version", "1.36")
	if code != exitUsage || !strings.Contains(stderr, "--target-version 1.36 contradicts "+manifest) || !strings.Contains(stderr, "registry.k8s.io/kube-apiserver:v1.37.2 is release 1.37") {
		t.Errorf("--target-version 1.36 against a 1.37.2 image: exit %d, stderr %q", code, stderr)
	}
	// Before an upgrade, a read-only check for the release upgraded to warns.
	code, _, stderr = runCLI(t, "verify", "--apiserver-manifest", manifest, "--target-version", "1.36")
	if code != 3 || !strings.Contains(stderr, "warning: --target-version 1.36 contradicts "+manifest) || !strings.Contains(stderr, "judging for 1.36") {
		t.Errorf("verify --target-version 1.36 against a 1.37.2 image: exit %d, stderr %q; want 3 and a warning", code, stderr)
	}
	newer := strings.Replace(readFile(t, manifest), "kube-apiserver:v1.37.2", "kube-apiserver:v1.38.0", 1)
	if err := os.WriteFile(manifest, []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, "migrate", "--apiserver-manifest", manifest)
	if code != exitUsage || !strings.Contains(stderr, "kube-apiserver:v1.38.0") || !strings.Contains(stderr, "newer than the Kubernetes release this tool carries") {
		t.Errorf("a 1.38 image: exit %d, stderr %q; want exit 2 naming the image", code, stderr)
	}

	// kubeadm's ClusterConfiguration in etcd says it when nothing else does.
	c.Put(tgt.KubeadmConfigKey("/registry"), schema.GroupResource{Resource: "configmaps"}, kubeadmConfig("v1.36.2"), "", "", "")
	if got := target(); got != "kube-apiserver 1.36 (protobuf; release from the kubeadm-config in etcd)" {
		t.Errorf("kubeadm-config v1.36.2: target %q", got)
	}
	// So does it in a snapshot file, read in place.
	snap := filepath.Join(t.TempDir(), "backup.db")
	if err := etcdscan.Snapshot(context.Background(), c.Cli, snap); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCLI(t, "verify", "-o", "json", "--snapshot-file", snap)
	var rep struct{ Target string }
	if err := json.Unmarshal([]byte(stdout), &rep); code != 3 || err != nil || rep.Target != "kube-apiserver 1.36 (protobuf; release from the kubeadm-config in etcd)" || !strings.Contains(stderr, "read in place") {
		t.Errorf("verify --snapshot-file with kubeadm-config: exit %d, target %q (%v), stderr %q", code, rep.Target, err, stderr)
	}
	code, stdout, stderr = runCLI(t, "migrate", "--endpoints", ep, "-o", "json", "--liveness-window", "500ms")
	if code != exitOK {
		t.Fatalf("migrate with kubeadm-config: exit %d\n%s", code, stderr)
	}
	var sum struct{ Summary struct{ Rewritten int } }
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil || sum.Summary.Rewritten != 1 {
		t.Errorf("migrate with kubeadm-config: %s %v; want the DeviceClass rewritten", stdout, err)
	}
}
