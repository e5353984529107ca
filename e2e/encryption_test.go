package e2e

import (
	"bytes"
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/kmstest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/verify"
)

const encNS = "vault"

var encResources = []string{"secrets", "configmaps"}

func secretData(i int) map[string][]byte {
	return map[string][]byte{"password": []byte(fmt.Sprintf("not-a-real-password-%d", i)), "user": []byte("app")}
}

func configMapData(i int) map[string]string {
	return map[string]string{"settings": fmt.Sprintf("level=%d\n", i)}
}

const encObjects = 5

// createEncrypted creates encObjects secrets and configmaps.
func createEncrypted(t *testing.T, rc *rest.Config) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(rc)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: encNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < encObjects; i++ {
		if _, err := cs.CoreV1().Secrets(encNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%d", i)}, Data: secretData(i)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ConfigMaps(encNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i)}, Data: configMapData(i)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// readBackEncrypted asserts a kube-apiserver serves every secret and configmap
// with its data, and that a no-op update of each writes nothing.
func readBackEncrypted(t *testing.T, rc *rest.Config, stage string) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(rc)
	for i := 0; i < encObjects; i++ {
		s, err := cs.CoreV1().Secrets(encNS).Get(ctx, fmt.Sprintf("s%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: secret %s/s%d: %v", stage, encNS, i, err)
		}
		want := secretData(i)
		if len(s.Data) != len(want) || !bytes.Equal(s.Data["password"], want["password"]) || !bytes.Equal(s.Data["user"], want["user"]) {
			t.Errorf("%s: secret %s/s%d data differs from what was written", stage, encNS, i)
		}
		cm, err := cs.CoreV1().ConfigMaps(encNS).Get(ctx, fmt.Sprintf("c%d", i), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: configmap %s/c%d: %v", stage, encNS, i, err)
		}
		if cm.Data["settings"] != configMapData(i)["settings"] || len(cm.Data) != 1 {
			t.Errorf("%s: configmap %s/c%d data = %v, want %v", stage, encNS, i, cm.Data, configMapData(i))
		}
		for _, o := range []struct {
			what   string
			update func() (string, string, error)
		}{
			{"secret", func() (string, string, error) {
				u, err := cs.CoreV1().Secrets(encNS).Update(ctx, s, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
				if err != nil {
					return "", "", err
				}
				return s.ResourceVersion, u.ResourceVersion, nil
			}},
			{"configmap", func() (string, string, error) {
				u, err := cs.CoreV1().ConfigMaps(encNS).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
				if err != nil {
					return "", "", err
				}
				return cm.ResourceVersion, u.ResourceVersion, nil
			}},
		} {
			before, after, err := o.update()
			if err != nil {
				t.Fatalf("%s: no-op update of %s %d: %v", stage, o.what, i, err)
			}
			if before != after {
				t.Errorf("%s: no-op update of %s %d was written (%s -> %s): kube-apiserver found it stale", stage, o.what, i, before, after)
			}
		}
	}
}

// assertEncryptedWith asserts every secret and configmap is stored with the
// given prefix ("" = plaintext protobuf).
func assertEncryptedWith(t *testing.T, c *cluster, prefix, stage string) {
	t.Helper()
	for i := 0; i < encObjects; i++ {
		for _, key := range []string{fmt.Sprintf("/registry/secrets/%s/s%d", encNS, i), fmt.Sprintf("/registry/configmaps/%s/c%d", encNS, i)} {
			v, _, _ := etcdValue(t, c.cli, key)
			switch {
			case prefix == "" && !bytes.HasPrefix(v, protobufMagic):
				t.Errorf("%s: %s is not plaintext protobuf (starts %q)", stage, key, v[:min(len(v), 24)])
			case prefix != "" && !bytes.HasPrefix(v, []byte(prefix)):
				t.Errorf("%s: %s does not start with %q (starts %q)", stage, key, prefix, v[:min(len(v), 24)])
			}
		}
	}
}

// migrateEncryption runs verify (expects stale), migrate, verify (expects
// current) with the given EncryptionConfiguration, all with no apiserver up.
func migrateEncryption(t *testing.T, c *cluster, encPath, stage string) {
	t.Helper()
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: encPath}, Resources: encResources}
	rep := c.verify(cfg)
	if code := rep.ExitCode(); code != verify.ExitStale {
		t.Fatalf("%s: verify exit %d before migrate, want 3 (summary %+v)", stage, code, rep.Summary)
	}
	// Every secret and configmap is stale: the test's and the one the
	// apiserver keeps in kube-system.
	if rep.Summary.Stale != rep.Summary.Objects || rep.Summary.Stale < 2*encObjects {
		t.Errorf("%s: verify found %d of %d objects stale, want all (at least %d)", stage, rep.Summary.Stale, rep.Summary.Objects, 2*encObjects)
	}
	sum := c.migrate(cfg)
	if sum.Summary.Rewritten != rep.Summary.Stale {
		t.Errorf("%s: migrate rewrote %d, verify found %d stale", stage, sum.Summary.Rewritten, rep.Summary.Stale)
	}
	c.expectCurrent(cfg)
}

// TestEncryptionAtRest walks secrets and configmaps through identity ->
// aescbc key1 -> aescbc key2 (rotation, key1 then removed) -> identity ->
// KMS v2 -> KMS v2 with a rotated key ID. After each migration a
// kube-apiserver that only has the new provider serves every object.
func TestEncryptionAtRest(t *testing.T) {
	c := newCluster(t)
	res := encResources

	// Written in plaintext.
	createEncrypted(t, c.start(apiservertest.Options{}))
	c.stop()
	assertEncryptedWith(t, c, "", "identity")

	// identity -> aescbc key1.
	migrateEncryption(t, c, c.writeEncryptionConfig("key1-first.yaml", res, aescbcProvider("key1", 1), identityProvider), "identity->aescbc")
	assertEncryptedWith(t, c, "k8s:enc:aescbc:v1:key1:", "identity->aescbc")
	readBackEncrypted(t, c.start(apiservertest.Options{EncryptionConfigPath: c.writeEncryptionConfig("key1-only.yaml", res, aescbcProvider("key1", 1))}), "aescbc key1 only")
	c.stop()

	// Key rotation: key2 first, key1 still readable; then key1 is dropped.
	migrateEncryption(t, c, c.writeEncryptionConfig("key2-key1.yaml", res, aescbcProvider("key2", 2), aescbcProvider("key1", 1)), "rotation key1->key2")
	assertEncryptedWith(t, c, "k8s:enc:aescbc:v1:key2:", "rotation key1->key2")
	key2Only := c.writeEncryptionConfig("key2-only.yaml", res, aescbcProvider("key2", 2))
	c.expectCurrent(pipeline.Config{Target: target.Input{EncryptionConfig: key2Only}, Resources: res})
	readBackEncrypted(t, c.start(apiservertest.Options{EncryptionConfigPath: key2Only}), "aescbc key2 only")
	c.stop()

	// aescbc -> identity (decrypt everything), then an apiserver without encryption.
	migrateEncryption(t, c, c.writeEncryptionConfig("identity-key2.yaml", res, identityProvider, aescbcProvider("key2", 2)), "aescbc->identity")
	assertEncryptedWith(t, c, "", "aescbc->identity")
	readBackEncrypted(t, c.start(apiservertest.Options{}), "no encryption")
	c.stop()

	// identity -> KMS v2 with a real plugin over gRPC.
	kms := kmstest.StartV2T(t, "kek-1")
	migrateEncryption(t, c, c.writeEncryptionConfig("kms-identity.yaml", res, kmsV2Provider("e2e-kms", kms.Endpoint()), identityProvider), "identity->kms v2")
	assertEncryptedWith(t, c, "k8s:enc:kms:v2:e2e-kms:", "identity->kms v2")
	kmsOnly := c.writeEncryptionConfig("kms-only.yaml", res, kmsV2Provider("e2e-kms", kms.Endpoint()))
	readBackEncrypted(t, c.start(apiservertest.Options{EncryptionConfigPath: kmsOnly}), "kms v2 only")
	c.stop()

	// The KMS plugin rotates its key: values under kek-1 are stale; after the
	// migration the old key can be forgotten by the plugin.
	if err := kms.SetKeyID("kek-2"); err != nil {
		t.Fatal(err)
	}
	migrateEncryption(t, c, kmsOnly, "kms v2 key id rotation")
	kms.ForgetKeyID("kek-1")
	c.expectCurrent(pipeline.Config{Target: target.Input{EncryptionConfig: kmsOnly}, Resources: res})
	readBackEncrypted(t, c.start(apiservertest.Options{EncryptionConfigPath: kmsOnly}), "kms v2 after key rotation, old key forgotten")
	c.stop()
}
