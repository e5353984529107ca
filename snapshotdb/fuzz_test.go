package snapshotdb

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/schema"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// The snapshot-file reader's fuzzing. Its inputs are damaged copies of two
// real files (testdata/fuzz-base): a snapshot etcd saved of a small
// keyspace — a key bucket of several leaves under a branch page, a value
// on overflow pages, a lease, a deleted key, history compacted — and the
// same database as a member's member/snap/db that bbolt has given a free
// list (etcd's snapshots have none). A fuzz input says which file, and the
// bytes to damage: a list of patches (XORed in at an offset), a length to
// cut the file to, and whether to write the meta pages' checksums again
// (so that damage to the root, the free list or the page count reaches past
// bbolt's check of them). `go test -run TestFuzzBase -update-fuzz` writes the
// files and the committed corpus again.

var updateFuzz = flag.Bool("update-fuzz", false, "write testdata/fuzz-base and the committed corpus of FuzzSnapshotFile again")

// fuzzBases are the files a fuzz input damages, by number.
var fuzzBases = []string{"snapshot.db.gz", "member.db.gz"}

func readFuzzBase(t testing.TB, i int) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "fuzz-base", fuzzBases[i%len(fuzzBases)]))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// damage applies a fuzz input to a copy of base.
func damage(base []byte, patch []byte, cut uint32, fixMeta bool) []byte {
	b := bytes.Clone(base)
	// A patch: the offset (4 bytes, little endian, modulo the length), the
	// count (1 byte, 1 to 16) and that many bytes XORed in.
	for len(patch) >= 6 {
		off := int(binary.LittleEndian.Uint32(patch) % uint32(len(b)))
		n := min(int(patch[4]%16)+1, len(patch)-5)
		for i, x := range patch[5 : 5+n] {
			if off+i < len(b) {
				b[off+i] ^= x
			}
		}
		patch = patch[5+n:]
	}
	if fixMeta {
		for _, at := range []int{0, 4096} {
			if at+pageHeaderSize+64 <= len(b) {
				m := b[at+pageHeaderSize:]
				h := fnv.New64a()
				h.Write(m[:56])
				native.PutUint64(m[56:], h.Sum64())
			}
		}
	}
	if cut != 0 {
		b = b[:int(cut%uint32(len(b)+1))]
	}
	return b
}

// FuzzSnapshotFile opens damaged snapshot files with --skip-hash-check (what
// reads a file whose digest proves nothing) and reads every key, at the
// file's revision and at its oldest, with the mapping dropped every few KB
// and the key index spilled in small runs. Nothing may panic, fault, hang or
// grow memory past the file's size; a file refused is one line naming it,
// written after the file is closed (the crash of issue 39: an error that
// pointed into the unmapped file).
func FuzzSnapshotFile(f *testing.F) {
	bases := [][]byte{readFuzzBase(f, 0), readFuzzBase(f, 1)}
	for i, b := range bases {
		f.Add(uint8(i), []byte(nil), uint32(0), false)
		// Cut at every page boundary (and just past it).
		for at := 0; at <= len(b); at += 4096 {
			f.Add(uint8(i), []byte(nil), uint32(at), false)
			f.Add(uint8(i), []byte(nil), uint32(at+17), false)
		}
	}
	defer setFuzzLimits()()
	f.Fuzz(func(t *testing.T, base uint8, patch []byte, cut uint32, fixMeta bool) {
		b := damage(bases[int(base)%len(bases)], patch, cut, fixMeta)
		path := filepath.Join(t.TempDir(), "db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		// Fuzzing has no deadline per input: a hang would stall a worker
		// silently. Crash instead, so that the engine records the input.
		watchdog := time.AfterFunc(30*time.Second, func() { panic(fmt.Sprintf("reading %s hangs", path)) })
		defer watchdog.Stop()
		checkOneLine := func(what string, err error) {
			t.Helper()
			if err == nil {
				return
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "snapshot file "+path+": ") {
				t.Fatalf("%s: %q: want one line naming the file", what, msg)
			}
		}
		sf, err := Open(path, Options{SkipHashCheck: true})
		checkOneLine("Open", err)
		if err != nil {
			return
		}
		defer sf.Close()
		ctx := context.Background()
		for _, rev := range []int64{0, sf.Info.CompactRevision} {
			_, err := sf.Scan(ctx, etcdscan.ScanOptions{Prefixes: []string{"/registry/", "/zz"}, PageSize: 7, Revision: rev}, func(page []etcdscan.KV) error {
				for _, kv := range page {
					if kv.Key == "" {
						return fmt.Errorf("a key without a name")
					}
				}
				return nil
			})
			if err != nil && !errors.Is(err, context.Canceled) {
				checkOneLine("Scan", err)
			}
		}
		_, err = sf.Count(ctx, "/registry/")
		checkOneLine("Count", err)
		_, _, err = sf.Get(ctx, "/registry/configmaps/fz/cm-07", 0)
		checkOneLine("Get", err)
		_, err = sf.Lease(ctx, 1)
		checkOneLine("Lease", err)
		err = sf.EachRevision(ctx, func(main, sub int64) error { return nil })
		checkOneLine("EachRevision", err)
	})
}

// setFuzzLimits makes a small file's reads spill the index as a large
// one's do; it returns what puts it back.
func setFuzzLimits() (restore func()) {
	r := runBytes
	runBytes = 3000
	return func() { runBytes = r }
}

// TestFuzzBase: the files FuzzSnapshotFile damages read clean, and hold
// what the fuzzing is to damage: more than one level of pages in the key
// bucket, a value on overflow pages, inline buckets, a free list (the
// member's), leases, a compaction. With -update-fuzz it makes them again
// from a real etcd, and the committed corpus from them.
func TestFuzzBase(t *testing.T) {
	if *updateFuzz {
		writeFuzzBase(t)
	}
	for i := range fuzzBases {
		b := readFuzzBase(t, i)
		path := filepath.Join(t.TempDir(), "db")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		sf, err := Open(path, Options{SkipHashCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		n, err := sf.Count(context.Background(), "/registry/")
		if err != nil || n < 40 || sf.Info.Leases == 0 || sf.Info.CompactRevision == 0 {
			t.Errorf("%s: %d keys (%v), %+v: want 40 or more, leases, a compaction", fuzzBases[i], n, err, sf.Info)
		}
		sf.Close()
		flags := map[uint16]int{}
		overflow, inline := false, false
		for off := 0; off+pageHeaderSize <= len(b); off += 4096 {
			fl := native.Uint16(b[off+8:])
			flags[fl]++
			overflow = overflow || ((fl == leafPageFlag || fl == branchPageFlag) && native.Uint32(b[off+12:]) > 0)
		}
		db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		_ = db.View(func(tx *bolt.Tx) error {
			return tx.ForEach(func(_ []byte, b *bolt.Bucket) error {
				inline = inline || b.Stats().InlineBucketN > 0
				return nil
			})
		})
		db.Close()
		if flags[branchPageFlag] == 0 || !overflow || !inline || (i == 1) != (flags[freelistPageFlag] > 0) {
			t.Errorf("%s: pages by type %v, overflow %v, inline buckets %v: want branch pages, overflow, inline buckets, a free list in the member's only", fuzzBases[i], flags, overflow, inline)
		}
	}
}

// writeFuzzBase writes testdata/fuzz-base from a real etcd, and the
// committed corpus of FuzzSnapshotFile from it.
func writeFuzzBase(t *testing.T) {
	ctx := context.Background()
	srv, err := testetcd.Start(testetcd.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(k, v string, opts ...clientv3.OpOption) {
		if _, err := cli.Put(ctx, k, v, opts...); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 48 {
		put(fmt.Sprintf("/registry/configmaps/fz/cm-%02d", i), strings.Repeat(string(rune('a'+i%26)), 80))
	}
	put("/registry/configmaps/fz/big", strings.Repeat("b", 6000))
	for i := range 3 {
		put("/registry/configmaps/fz/cm-00", fmt.Sprintf("v%d", i))
	}
	if _, err := cli.Delete(ctx, "/registry/configmaps/fz/cm-01"); err != nil {
		t.Fatal(err)
	}
	rev, err := srv.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, rev-2, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	put("/registry/events/fz/e", "event", clientv3.WithLease(lease.ID))
	put("/registry/configmaps/fz/cm-02", "after the compaction")
	dir := t.TempDir()
	snap := filepath.Join(dir, "snapshot.db")
	if err := etcdscan.Snapshot(ctx, cli, snap); err != nil {
		t.Fatal(err)
	}
	good, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	// The member's: the database without the trailer, opened for writing by
	// bbolt, which writes its free list.
	member := filepath.Join(dir, "member.db")
	if err := os.WriteFile(member, good[:len(good)-32], 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(member, 0o600, &bolt.Options{NoFreelistSync: false})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join("testdata", "fuzz-base")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, src := range []string{snap, member} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		var z bytes.Buffer
		w, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		w.Write(b)
		w.Close()
		if err := os.WriteFile(filepath.Join(out, fuzzBases[i]), z.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeFuzzCorpus(t, good, readFuzzBase(t, 1))
}

// writeFuzzCorpus writes the committed corpus of FuzzSnapshotFile: the
// damage that crashed the tool (issue 39) in its smallest form, and damage
// to each part of the page structure bbolt trusts.
func writeFuzzCorpus(t *testing.T, snap, member []byte) {
	dir := filepath.Join("testdata", "fuzz", "FuzzSnapshotFile")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, base uint8, patch []byte, cut uint32, fixMeta bool) {
		s := fmt.Sprintf("go test fuzz v1\nuint8(%d)\n[]byte(%s)\nuint32(%d)\nbool(%v)\n", base, strconv.Quote(string(patch)), cut, fixMeta)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	xor := func(off int, x ...byte) []byte {
		p := binary.LittleEndian.AppendUint32(nil, uint32(off))
		return append(append(p, byte(len(x)-1)), x...)
	}
	// The crash: a record of the key bucket that does not decode. Its key
	// went into the error, pointing into the mapping, and writing the
	// error after the file was closed faulted (exit 2, "fatal error:
	// fault", in input.(*Error).Render). The first byte of the record of
	// cm-10, its key's protobuf tag, made an invalid wire type.
	at := bytes.Index(snap, []byte("/registry/configmaps/fz/cm-10"))
	if at < 2 || snap[at-2] != 0x0a {
		t.Fatalf("no record of cm-10 in the snapshot")
	}
	write("issue-39-error-into-the-mapping", 0, xor(at-2, 0x0a^0x0f), 0, false)
	// The pages: the key bucket's root (a branch page) and its first leaf.
	path := filepath.Join(t.TempDir(), "db")
	if err := os.WriteFile(path, snap, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var branch, leaf int
	_ = db.View(func(tx *bolt.Tx) error {
		branch = int(tx.Bucket(schema.Key.Name()).RootPage()) * 4096
		return nil
	})
	db.Close()
	if native.Uint16(snap[branch+8:]) != branchPageFlag {
		t.Fatalf("the key bucket's root is not a branch page")
	}
	leaf = int(native.Uint64(snap[branch+pageHeaderSize+8:])) * 4096
	id := func(off int) uint64 { return uint64(off / 4096) }
	self := native.AppendUint64(nil, id(branch)^native.Uint64(snap[branch+pageHeaderSize+8:]))
	write("branch-refers-to-itself", 0, xor(branch+pageHeaderSize+8, self...), 0, false)
	second := native.Uint64(snap[branch+pageHeaderSize+elementSize+8:])
	shared := native.AppendUint64(nil, second^native.Uint64(snap[branch+pageHeaderSize+8:]))
	write("branch-refers-twice", 0, xor(branch+pageHeaderSize+8, shared...), 0, false)
	write("branch-child-past-the-end", 0, xor(branch+pageHeaderSize+8+3, 0x40), 0, false)
	write("branch-count-zero", 0, xor(branch+10, snap[branch+10], snap[branch+11]), 0, false)
	write("leaf-count-huge", 0, xor(leaf+11, 0x7f), 0, false)
	write("leaf-key-position-past-the-end", 0, xor(leaf+pageHeaderSize+4+2, 0x10), 0, false)
	write("leaf-key-position-shifted", 0, xor(leaf+pageHeaderSize+elementSize+4, 0x08), 0, false)
	write("page-type-meta", 0, xor(branch+8, branchPageFlag^0x04), 0, false)
	write("page-id-wrong", 0, xor(leaf, 0x01), 0, false)
	write("overflow-past-the-end", 0, xor(leaf+15, 0x10), 0, false)
	// Meta pages, with their checksums written again: the root bucket at
	// the first meta page; the page count past the end of the file.
	root := snap[2*pageHeaderSize : 2*pageHeaderSize+8]
	write("meta-root-at-a-meta-page", 0, append(xor(2*pageHeaderSize, root...), xor(4096+2*pageHeaderSize, snap[4096+2*pageHeaderSize:4096+2*pageHeaderSize+8]...)...), 0, true)
	write("meta-page-count-past-the-file", 0, append(xor(pageHeaderSize+40+3, 0x01), xor(4096+pageHeaderSize+40+3, 0x01)...), 0, true)
	// The member's free list, listing the branch page (in use) as free.
	free := -1
	for off := 2 * 4096; off+pageHeaderSize <= len(member); off += 4096 {
		if native.Uint16(member[off+8:]) == freelistPageFlag {
			free = off
		}
	}
	if free < 0 || native.Uint16(member[free+10:]) == 0xFFFF {
		t.Fatalf("no free list of a few pages in the member's database")
	}
	count := native.AppendUint16(nil, native.Uint16(member[free+10:])^(native.Uint16(member[free+10:])+1))
	entry := native.AppendUint64(nil, id(branch)^native.Uint64(member[free+pageHeaderSize:]))
	write("member-free-list-lists-a-page-in-use", 1, append(xor(free+10, count...), xor(free+pageHeaderSize, entry...)...), 0, false)
	write("truncated-after-the-meta-pages", 0, nil, 2*4096, false)
	write("truncated-mid-page", 0, nil, uint32(len(snap)/2+100), false)
}
