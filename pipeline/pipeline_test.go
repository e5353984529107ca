package pipeline

import (
	"context"
	"errors"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestWrongPrefix: a cluster stored under another --etcd-prefix gets a one-line
// error naming the flag and a key that is there; the right prefix works.
func TestWrongPrefix(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli := srv.ClientT(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, "/kubernetes.io/namespaces/default", "x"); err != nil {
		t.Fatal(err)
	}
	_, err := Setup(ctx, cli, Config{Prefix: "/registry"})
	var pe *PrefixError
	if !errors.As(err, &pe) || pe.Prefix != "/registry" || !strings.Contains(err.Error(), "/kubernetes.io/namespaces/default") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v", err)
	}
	env, err := Setup(ctx, cli, Config{Prefix: "/kubernetes.io"})
	if err != nil {
		t.Fatalf("right prefix: %v", err)
	}
	env.Close()
}
