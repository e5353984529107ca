package testetcd

import (
	"context"
	"testing"
)

func TestStartPutGet(t *testing.T) {
	s := StartT(t, Options{})
	cli, err := s.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "/registry/x", "y"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "/registry/x")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "y" {
		t.Fatalf("got %v", resp.Kvs)
	}
}
