package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedIsCurrent: decode/zz_generated_releases.go is what the
// older releases' own code gives (after modbuild.OlderKubernetes
// changes, go run ./internal/releasegen).
func TestGeneratedIsCurrent(t *testing.T) {
	fresh := filepath.Join(t.TempDir(), "releases.go")
	if err := run(context.Background(), fresh); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(fresh)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join("..", "..", output))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not what go run ./internal/releasegen writes now: run it", output)
	}
}
