package apiserverconfig

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/testrig/kmstest"
)

// The KMS plugin's socket as kube-apiserver sees it in its container.
const (
	kmsSocketDir      = "/var/run/kmsplugin"
	containerEndpoint = "unix:///var/run/kmsplugin/kms.sock"
)

// encryptionConfig is an EncryptionConfiguration for secrets: a KMS v2
// provider at endpoint, then an aescbc key (public test material).
func encryptionConfig(endpoint string) string {
	return `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - kms: {apiVersion: v2, name: vault, endpoint: "` + endpoint + `", timeout: 3s}
  - aescbc: {keys: [{name: key1, secret: "YXBpc2VydmVyY29uZmlnLXRlc3Qta2V5LXB1YmxpYyE="}]}
`
}

// kmsManifest writes the kubeadm manifest with its encryption configuration
// directory mounted from encDir and, with socketDir set, the plugin's socket
// directory mounted from socketDir at kmsSocketDir (what a KMS plugin on the
// node asks of kube-apiserver's pod).
func kmsManifest(t *testing.T, encDir, socketDir string) string {
	t.Helper()
	return writeManifest(t, func(s string) string {
		s = strings.Replace(s, "      path: /etc/kubernetes/encryption\n", "      path: "+encDir+"\n", 1)
		if socketDir == "" {
			return s
		}
		s = strings.Replace(s, "    - mountPath: /etc/kubernetes/enc\n      name: encryption-config\n      readOnly: true\n",
			"    - mountPath: /etc/kubernetes/enc\n      name: encryption-config\n      readOnly: true\n    - mountPath: "+kmsSocketDir+"\n      name: kms-socket\n", 1)
		return strings.Replace(s, "status: {}", "  - hostPath:\n      path: "+socketDir+"\n      type: Directory\n    name: kms-socket\nstatus: {}", 1)
	})
}

// TestManifestKMSEndpoint: the manifest's encryption configuration names the
// KMS plugin by its socket inside kube-apiserver's container; the plugin
// listens on the host directory the pod mounts there. A value kube-apiserver
// encrypted through the plugin decrypts only with the endpoint mapped through
// the hostPath volume: as written, the tool dials the container path.
func TestManifestKMSEndpoint(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	hostEndpoint := "unix://" + plugin.SocketPath()
	encDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(encDir, "encryption-config.yaml"), []byte(encryptionConfig(containerEndpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	manifest := kmsManifest(t, encDir, filepath.Dir(plugin.SocketPath()))
	cfg, err := Load(Input{Manifest: manifest})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(encDir, "encryption-config.yaml"); cfg.EncryptionConfig != want {
		t.Fatalf("encryption config %q, want %q", cfg.EncryptionConfig, want)
	}

	// What kube-apiserver wrote, reaching the plugin from its container.
	writerPath := filepath.Join(t.TempDir(), "as-kube-apiserver-sees-it.yaml")
	if err := os.WriteFile(writerPath, []byte(encryptionConfig(hostEndpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	writer, err := encryption.Load(ctx, writerPath)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	secrets := schema.GroupResource{Resource: "secrets"}
	key, plain := "/registry/secrets/default/db", []byte("k8s\x00 a secret value")
	ct, err := writer.Encrypt(ctx, secrets, key, plain)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(ct, []byte("k8s:enc:kms:v2:vault:")) {
		t.Fatalf("not written through the KMS v2 plugin: %q", ct)
	}

	mapEndpoint := cfg.KMSEndpointMapper(cfg.EncryptionConfig)
	if mapEndpoint == nil {
		t.Fatal("KMSEndpointMapper: nil for the manifest's encryption configuration")
	}
	mapped, err := encryption.LoadWith(ctx, cfg.EncryptionConfig, encryption.Options{MapKMSEndpoint: mapEndpoint})
	if err != nil {
		t.Fatalf("loading with the mapped endpoint: %v", err)
	}
	defer mapped.Close()
	got, info, err := mapped.Decrypt(ctx, secrets, key, ct)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("decrypting through the mapped endpoint: %q, %v; want the plaintext", got, err)
	}
	if info.String() != "kms2:vault" {
		t.Errorf("read as %s, want kms2:vault", info)
	}
	if err := mapped.Preflight(ctx, []schema.GroupResource{secrets}); err != nil {
		t.Errorf("preflight through the mapped endpoint: %v", err)
	}
	line := cfg.Describe(cfg.Release(), cfg.From["release"])
	if want := "(manifest; kms endpoint " + containerEndpoint + " -> " + hostEndpoint + ")"; !strings.Contains(line, want) {
		t.Errorf("Describe() = %q, want it to contain %q", line, want)
	}

	// As written, the endpoint is the container's path: nothing the tool can reach.
	unmapped, err := encryption.Load(ctx, cfg.EncryptionConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer unmapped.Close()
	if _, _, err := unmapped.Decrypt(ctx, secrets, key, ct); err == nil {
		t.Errorf("decrypted with the container endpoint: the mapping is not what made it work")
	}
	if err := unmapped.Preflight(ctx, []schema.GroupResource{secrets}); err == nil || !strings.Contains(err.Error(), containerEndpoint) {
		t.Errorf("preflight with the container endpoint: %v; want an error naming %s", err, containerEndpoint)
	}
}

// TestManifestKMSEndpointNotMapped: the tool's own --encryption-provider-config
// and a flags file's are host paths, so nothing is mapped; an abstract socket
// is a name, not a file, and is kept; a socket under no hostPath mount is an
// error naming the endpoint and the manifest.
func TestManifestKMSEndpointNotMapped(t *testing.T) {
	encDir := t.TempDir()
	encFile := filepath.Join(encDir, "encryption-config.yaml")
	if err := os.WriteFile(encFile, []byte(encryptionConfig(containerEndpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(Input{Manifest: kmsManifest(t, encDir, t.TempDir())})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.KMSEndpointMapper("/elsewhere/encryption-config.yaml") != nil {
		t.Errorf("a mapping for a file that is not the manifest's")
	}
	mapEndpoint := cfg.KMSEndpointMapper(cfg.EncryptionConfig)
	if mapEndpoint == nil {
		t.Fatal("no mapping for the manifest's own file")
	}
	for _, ep := range []string{"unix:///@kms-abstract", "unix:///var/run/kmsplugin/../../../proc/self/x"} {
		got, err := mapEndpoint(ep)
		if ep == "unix:///@kms-abstract" && (err != nil || got != ep) {
			t.Errorf("abstract socket %s mapped to %q, %v; want it kept", ep, got, err)
		}
		var unmapped *UnmappedKMSEndpointError
		if ep != "unix:///@kms-abstract" && (!errors.As(err, &unmapped) || unmapped.Endpoint != ep || unmapped.Manifest != cfg.File || !strings.Contains(err.Error(), ep)) {
			t.Errorf("%s (outside the mount once cleaned): %q, %v; want an *UnmappedKMSEndpointError naming it and the manifest", ep, got, err)
		}
	}
	cfg.SetFrom("encryption-provider-config", FromTool)
	if cfg.KMSEndpointMapper(cfg.EncryptionConfig) != nil {
		t.Errorf("a mapping although the tool's own --encryption-provider-config overrode the manifest's")
	}

	flags := filepath.Join(t.TempDir(), "flags")
	if err := os.WriteFile(flags, []byte("--etcd-servers=http://127.0.0.1:2379\n--encryption-provider-config="+encFile+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFlags, err := Load(Input{FlagsFile: flags})
	if err != nil {
		t.Fatal(err)
	}
	if fromFlags.KMSEndpointMapper(fromFlags.EncryptionConfig) != nil {
		t.Errorf("a mapping for a flags file's encryption configuration (host paths)")
	}

	manifest := kmsManifest(t, encDir, "")
	noMount, err := Load(Input{Manifest: manifest})
	if err != nil {
		t.Fatal(err)
	}
	_, err = encryption.LoadWith(context.Background(), noMount.EncryptionConfig, encryption.Options{MapKMSEndpoint: noMount.KMSEndpointMapper(noMount.EncryptionConfig)})
	if err == nil {
		t.Fatal("loaded although the socket is under no hostPath mount")
	}
	for _, want := range []string{encFile, containerEndpoint, manifest, string(input.EncryptionProviderConfig)} {
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q: want one line naming %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "YXBpc2VydmVy") {
		t.Errorf("error quotes key material: %q", err)
	}
}
