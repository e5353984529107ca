package apiserverconfig

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const etcdPod = `apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
spec:
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.16-0
    command:
    - etcd
    - --data-dir=/var/lib/etcd
%s
    env:
    - name: QUOTA
      value: "4294967296"
`

// TestEtcdManifestQuota: etcd's --quota-backend-bytes is read from the etcd
// manifest beside kube-apiserver's, or in manifests/ when kube-apiserver's
// was moved up out of it (the runbooks' way of stopping it), in the forms
// etcd accepts; no flag is etcd's default (0); a --config-file under no
// hostPath volume is an error naming the manifest (one that is mounted is
// read: TestEtcdPodConfigFile).
func TestEtcdManifestQuota(t *testing.T) {
	for _, tc := range []struct {
		flags string
		want  int64
		err   string
	}{
		{flags: "    - --quota-backend-bytes=8589934592", want: 8 << 30},
		{flags: "    - --quota-backend-bytes\n    - \"2147483648\"", want: 2 << 30},
		{flags: "    - --quota-backend-bytes=$(QUOTA)", want: 4 << 30},
		{flags: "    - --snapshot-count=10000", want: 0},
		{flags: "    - --config-file=/etc/etcd/etcd.conf.yml", err: "--config-file"},
		{flags: "    - --quota-backend-bytes=lots", err: "not a number"},
	} {
		for _, moved := range []bool{false, true} {
			dir := t.TempDir()
			manifests := filepath.Join(dir, "manifests")
			if err := os.MkdirAll(manifests, 0o755); err != nil {
				t.Fatal(err)
			}
			etcdFile := filepath.Join(manifests, "etcd.yaml")
			if err := os.WriteFile(etcdFile, []byte(strings.Replace(etcdPod, "%s", tc.flags, 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			apiserver := filepath.Join(manifests, "kube-apiserver.yaml")
			if moved {
				apiserver = filepath.Join(dir, "kube-apiserver.yaml")
			}
			q, err := EtcdManifestQuota(apiserver)
			switch {
			case tc.err != "":
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), etcdFile) {
					t.Errorf("%q: err = %v, want %q naming %s", tc.flags, err, tc.err, etcdFile)
				}
			case err != nil || q.Bytes != tc.want || q.File != etcdFile:
				t.Errorf("%q (moved %v): %+v %v, want %d from %s", tc.flags, moved, q, err, tc.want, etcdFile)
			}
		}
	}
	if _, err := EtcdManifestQuota(filepath.Join(t.TempDir(), "kube-apiserver.yaml")); !errors.Is(err, ErrNoEtcdManifest) {
		t.Fatalf("no etcd manifest: %v", err)
	}
}

// kubeadmEtcd is etcd's manifest as kubeadm writes it on a second control
// plane node (stacked etcd), its data directory moved on the host.
const kubeadmEtcd = `apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --advertise-client-urls=https://10.0.0.12:2379
    - --cert-file=/etc/kubernetes/pki/etcd/server.crt
    - --client-cert-auth=true
    - --data-dir=/var/lib/etcd
    - --initial-advertise-peer-urls=https://10.0.0.12:2380
    - --initial-cluster=cp-1=https://10.0.0.11:2380,cp-2=https://10.0.0.12:2380
    - --initial-cluster-state=existing
    - --name
    - cp-2
    image: registry.k8s.io/etcd:3.6.16-0
    name: etcd
    volumeMounts:
    - mountPath: /var/lib/etcd
      name: etcd-data
    - mountPath: /etc/kubernetes/pki/etcd
      name: etcd-certs
  hostNetwork: true
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki/etcd
      type: DirectoryOrCreate
    name: etcd-certs
  - hostPath:
      path: /data/etcd
      type: DirectoryOrCreate
    name: etcd-data
`

// TestReadEtcdMember: the flags a snapshot restore of the member needs, and
// its data directory mapped through the hostPath volume to the host's.
func TestReadEtcdMember(t *testing.T) {
	file := filepath.Join(t.TempDir(), "etcd.yaml")
	if err := os.WriteFile(file, []byte(kubeadmEtcd), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := ReadEtcdMember(file)
	if err != nil {
		t.Fatal(err)
	}
	want := EtcdMember{File: file, Name: "cp-2", InitialCluster: "cp-1=https://10.0.0.11:2380,cp-2=https://10.0.0.12:2380",
		InitialAdvertisePeerURLs: "https://10.0.0.12:2380", DataDir: "/var/lib/etcd", HostDataDir: "/data/etcd"}
	if m != want {
		t.Fatalf("member:\n%+v\nwant\n%+v", m, want)
	}
	// No volume at the data directory: not on the host.
	noVolume := strings.Replace(kubeadmEtcd, "- --data-dir=/var/lib/etcd", "- --data-dir=/srv/etcd", 1)
	if err := os.WriteFile(file, []byte(noVolume), 0o600); err != nil {
		t.Fatal(err)
	}
	if m, err := ReadEtcdMember(file); err != nil || m.DataDir != "/srv/etcd" || m.HostDataDir != "" {
		t.Fatalf("unmounted data dir: %+v %v", m, err)
	}
}

// TestEtcdPodConfigFile: RKE2's etcd static pod runs etcd with
// --config-file (its data directory, mounted at the same path, holds it):
// the quota and the data directory come from that file, read under the node
// root, and etcd's own flags are ignored as etcd ignores them. kubeadm's
// etcd pod says its --data-dir on the command line, a container path mapped
// through its hostPath volume.
func TestEtcdPodConfigFile(t *testing.T) {
	root := t.TempDir()
	etcdDir := "/var/lib/rancher/rke2/server/db/etcd"
	if err := os.MkdirAll(filepath.Join(root, etcdDir), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := "data-dir: " + etcdDir + "\nquota-backend-bytes: 4294967296\nname: node-1\n"
	if err := os.WriteFile(filepath.Join(root, etcdDir, "config"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	pod := `apiVersion: v1
kind: Pod
metadata: {name: etcd, namespace: kube-system}
spec:
  containers:
  - name: etcd
    image: index.docker.io/rancher/hardened-etcd:v3.5.21-k3s1-build20250612
    command: [etcd]
    args: [--config-file=/var/lib/rancher/rke2/server/db/etcd/config, --quota-backend-bytes=1]
    volumeMounts:
    - {mountPath: /var/lib/rancher/rke2/server/db/etcd, name: dir0}
  volumes:
  - {hostPath: {path: /var/lib/rancher/rke2/server/db/etcd, type: DirectoryOrCreate}, name: dir0}
`
	file := filepath.Join(t.TempDir(), "etcd.yaml")
	if err := os.WriteFile(file, []byte(pod), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadEtcdPod(file, root)
	if err != nil {
		t.Fatal(err)
	}
	if got.QuotaBytes != 4<<30 || got.DataDir != filepath.Join(root, etcdDir) || got.ConfigFile != filepath.Join(root, etcdDir, "config") {
		t.Errorf("RKE2's etcd pod: %+v; want the quota 4 GiB and the data directory from %s under %s", got, etcdDir, root)
	}

	kubeadm := filepath.Join(t.TempDir(), "etcd.yaml")
	if err := os.WriteFile(kubeadm, []byte(strings.Replace(etcdPod, "%s", "    volumeMounts:\n    - {mountPath: /var/lib/etcd, name: etcd-data}", 1)+"  volumes:\n  - {hostPath: {path: /data/etcd, type: DirectoryOrCreate}, name: etcd-data}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err = ReadEtcdPod(kubeadm, root)
	if err != nil {
		t.Fatal(err)
	}
	if got.DataDir != filepath.Join(root, "/data/etcd") || got.QuotaBytes != 0 {
		t.Errorf("kubeadm's etcd pod: %+v; want the data directory %s", got, filepath.Join(root, "/data/etcd"))
	}
}
