package encryption

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"kube-etcd-migrate/internal/testrig/enctest"
)

// BenchmarkRotateSecret: one secret of 2 KB as a key rotation reads and
// writes it: decrypted under aescbc key1, encrypted under key2.
func BenchmarkRotateSecret(b *testing.B) {
	ctx := context.Background()
	load := func(providers ...string) *Transformers {
		path := filepath.Join(b.TempDir(), "encryption-config.yaml")
		if err := os.WriteFile(path, []byte(secretsConfig(providers...)), 0o600); err != nil {
			b.Fatal(err)
		}
		e, err := Load(ctx, path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(e.Close)
		return e
	}
	fresh := load(keyed("aescbc", "key1", enctest.Material1))
	rotated := load(keyed("aescbc", "key2", enctest.Material2, "key1", enctest.Material1))
	plain := bytes.Repeat([]byte("k8s\x00secret "), 200)
	stored, err := fresh.Encrypt(ctx, secretsGR, secretKey, plain)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		p, _, err := rotated.Decrypt(ctx, secretsGR, secretKey, stored)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rotated.Encrypt(ctx, secretsGR, secretKey, p); err != nil {
			b.Fatal(err)
		}
	}
}
