package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedIsCurrent: release/zz_generated_releases.go and
// internal/testrig/everyresource/zz_generated_stubs.go are what the older releases'
// own code gives (after modbuild.OlderKubernetes changes, go run
// ./internal/build/releasegen).
func TestGeneratedIsCurrent(t *testing.T) {
	root := t.TempDir()
	for _, f := range []string{output, stubsOutput} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(context.Background(), root); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{output, stubsOutput} {
		want, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("..", "..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is not what go run ./internal/build/releasegen writes now: run it", f)
		}
	}
}
