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
// etcd accepts; no flag is etcd's default (0); a --config-file is an error
// naming the manifest.
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
