package liveness

import (
	"context"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestDeletesAndNames: during the window a client deletes a key that has no
// etcd lease (a writer: refused, "deleted"), and an identity lease whose value
// does not decode (encrypted) is written: judged by its name, listed first.
// Nothing before the window counts.
func TestDeletesAndNames(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	for _, k := range []string{"/registry/configmaps/a/gone", "/registry/leases/kube-system/kube-apiserver-x1", "/registry/secrets/a/before"} {
		if _, err := cli.Put(ctx, k, "k8s:enc:aescbc:v1:key1:opaque"); err != nil {
			t.Fatal(err)
		}
	}
	// During the window; the last key is outside the prefix: not this cluster's.
	go func() {
		time.Sleep(150 * time.Millisecond)
		_, _ = cli.Delete(ctx, "/registry/configmaps/a/gone")
		_, _ = cli.Put(ctx, "/registry/leases/kube-system/kube-apiserver-x1", "k8s:enc:aescbc:v1:key1:opaque2")
		_, _ = cli.Put(ctx, "/other/leases/kube-system/kube-apiserver-x1", "v")
	}()
	rep, err := Observe(ctx, cli, "/registry/", 600*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Written) != 2 || rep.Written[0].Key != "/registry/leases/kube-system/kube-apiserver-x1" || rep.Written[0].Kind != IdentityLease ||
		rep.Written[1].Key != "/registry/configmaps/a/gone" || !rep.Written[1].Deleted {
		t.Fatalf("written %+v", rep.Written)
	}
	why := rep.Refusal()
	for _, want := range []string{"a kube-apiserver is alive", "/registry/leases/kube-system/kube-apiserver-x1 written once, mod revision 3 -> 6", "also written: 1 other key(s): /registry/configmaps/a/gone deleted once, mod revision 2 -> 5"} {
		if !strings.Contains(why, want) {
			t.Errorf("refusal %q does not say %q", why, want)
		}
	}
	if rep.ToRevision != 7 {
		t.Errorf("window ended at revision %d, want 7 (the write outside the prefix counted in etcd's revision)", rep.ToRevision)
	}
}
