package decode

import (
	"testing"

	"kube-etcd-migrate/release"
)

// BenchmarkResolve: a key of a namespaced built-in (a secret) resolved to
// its resource, namespace and name, as each key read is.
func BenchmarkResolve(b *testing.B) {
	rel, err := release.Named("")
	if err != nil {
		b.Fatal(err)
	}
	storage, err := NewStorageConfigFor(StorageOptions{Release: rel})
	if err != nil {
		b.Fatal(err)
	}
	r := NewResolver("/registry", storage)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if info, err := r.Resolve("/registry/secrets/bench-ns-07/secret-001234"); err != nil || info.Name != "secret-001234" {
			b.Fatal(info, err)
		}
	}
}
