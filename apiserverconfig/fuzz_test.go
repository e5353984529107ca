package apiserverconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// oneLineNaming fails t unless err is nil or one line that names file.
func oneLineNaming(t *testing.T, what string, err error, file string) {
	t.Helper()
	if err == nil {
		return
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, file) {
		t.Fatalf("%s: %q: want one line naming %s", what, msg, file)
	}
}

// hangs crashes the fuzzing on an input that does not return: fuzzing has no
// deadline per input, and the engine records a crash.
func hangs(what string) *time.Timer {
	return time.AfterFunc(30*time.Second, func() { panic(what + " hangs") })
}

// FuzzManifest reads arbitrary static-pod manifests as
// --apiserver-manifest, with an etcd manifest beside it (whose
// --quota-backend-bytes migrate's preflight reads): nothing panics or hangs,
// and a manifest refused is one line naming it. The seeds are kubeadm's
// kube-apiserver manifest (testdata/kubeadm) and the tests' etcd manifest.
func FuzzManifest(f *testing.F) {
	apiserver, err := os.ReadFile("../testdata/kubeadm/kube-apiserver.yaml")
	if err != nil {
		f.Fatal(err)
	}
	etcd := []byte(strings.Replace(etcdPod, "%s", "    - --quota-backend-bytes=$(QUOTA)", 1))
	f.Add(apiserver, etcd)
	f.Add(apiserver, []byte(strings.Replace(etcdPod, "%s", "    - --quota-backend-bytes\n    - \"2147483648\"", 1)))
	f.Add([]byte(strings.Replace(string(apiserver), "kube-apiserver:v", "kube-apiserver:x", 1)), []byte("kind: Pod\n"))
	f.Fuzz(func(t *testing.T, apiserver, etcd []byte) {
		dir := t.TempDir()
		manifest := filepath.Join(dir, "kube-apiserver.yaml")
		if err := os.WriteFile(manifest, apiserver, 0o600); err != nil {
			t.Fatal(err)
		}
		etcdFile := filepath.Join(dir, "etcd.yaml")
		if err := os.WriteFile(etcdFile, etcd, 0o600); err != nil {
			t.Fatal(err)
		}
		defer hangs(fmt.Sprintf("reading %q", apiserver)).Stop()
		cfg, err := Load(Input{Manifest: manifest})
		oneLineNaming(t, "Load", err, manifest)
		if err == nil {
			_ = cfg.Describe(cfg.Release(), FromManifest)
			if _, err := cfg.ResourceConfig(cfg.Release().Effective()); err != nil && strings.Contains(err.Error(), "\n") {
				t.Fatalf("ResourceConfig: %q: want one line", err)
			}
			if mapper := cfg.KMSEndpointMapper(cfg.EncryptionConfig); mapper != nil {
				_, err := mapper("unix:///run/kms/plugin.sock")
				if err != nil && strings.Contains(err.Error(), "\n") {
					t.Fatalf("KMS endpoint: %q: want one line", err)
				}
			}
		}
		_, err = EtcdManifestQuota(manifest)
		if !errors.Is(err, ErrNoEtcdManifest) {
			oneLineNaming(t, "EtcdManifestQuota", err, etcdFile)
		}
	})
}

// FuzzFlagsFile reads arbitrary files as --apiserver-flags-file (a systemd
// unit, an environment file, one flag a line): nothing panics or hangs, and
// a file refused is one line naming it.
func FuzzFlagsFile(f *testing.F) {
	f.Add([]byte("[Unit]\nDescription=Kubernetes API Server\n\n[Service]\nExecStart=/usr/local/bin/kube-apiserver \\\n  --etcd-servers=https://10.0.0.1:2379,https://10.0.0.2:2379 \\\n  --etcd-prefix=/k8s \\\n  --encryption-provider-config=\"/etc/kubernetes/encryption config.yaml\" \\\n  --runtime-config=api/all=true \\\n  --v=2\nRestart=on-failure\n"))
	f.Add([]byte("# one flag per line\n--etcd-servers=http://127.0.0.1:2379\n--storage-media-type=application/json\n--feature-gates=AllAlpha=true\n--emulated-version=1.36\n"))
	f.Add([]byte("kube-apiserver $KUBE_API_ARGS\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file := filepath.Join(t.TempDir(), "kube-apiserver.service")
		if err := os.WriteFile(file, data, 0o600); err != nil {
			t.Fatal(err)
		}
		defer hangs(fmt.Sprintf("reading %q", data)).Stop()
		_, err := Load(Input{FlagsFile: file})
		oneLineNaming(t, "Load", err, file)
	})
}
