// Package testsnap makes the damaged snapshot files the tests feed to both
// ways of reading a snapshot (snapshotdb in place, and its Restore),
// from a good file etcd's own snapshot code saved, so that both are refused
// on exactly the same files.
package testsnap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"kube-etcd-migrate/inventory"
	"kube-etcd-migrate/pipeline"
)

// Damaged are the paths of the damaged copies of one good snapshot.
type Damaged struct {
	// Truncated is the first half of the file (its sha256 trailer gone).
	Truncated string
	// Flipped has one byte of the database inverted: the trailer no longer matches.
	Flipped string
	// MemberDB is the database without the trailer, as a member's
	// member/snap/db is: read only with --skip-hash-check.
	MemberDB string
	// TruncatedMember is the first half of MemberDB.
	TruncatedMember string
	// Garbage is MemberDB with four pages after the meta pages overwritten.
	Garbage string
}

// Damage writes the damaged copies of good (the bytes of a snapshot file)
// into dir, mode 0600.
func Damage(t testing.TB, dir string, good []byte) Damaged {
	t.Helper()
	write := func(name string, b []byte) string { return Write(t, dir, name, b) }
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0xff
	noTrailer := good[:len(good)-sha256.Size]
	garbage := bytes.Clone(noTrailer)
	for i := 2 * 4096; i < 6*4096 && i < len(garbage); i++ {
		garbage[i] = 0xa5
	}
	return Damaged{
		Truncated:       write("truncated.db", good[:len(good)/2]),
		Flipped:         write("flipped.db", flipped),
		MemberDB:        write("db", noTrailer),
		TruncatedMember: write("truncated2.db", noTrailer[:len(noTrailer)/2]),
		Garbage:         write("garbage.db", garbage),
	}
}

// Write writes b to dir/name, mode 0600, and returns its path.
func Write(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// ReportJSON writes v as the commands print a report: indented JSON.
func ReportJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// InspectJSON is the inspect command's report of key, written as JSON to w
// (the report of a key that does not decode, then its error).
func InspectJSON(ctx context.Context, env *pipeline.Env, key string, w io.Writer) error {
	o, err := inventory.Inspect(ctx, env, key, false)
	if o != nil {
		if werr := ReportJSON(w, o); werr != nil {
			return werr
		}
	}
	return err
}
