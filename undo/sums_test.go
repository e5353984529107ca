package undo_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/undo"
)

// TestRunEndSumsAreTheFiles: what a run records at its end of its journal
// (bytes, sha256, records, the keys its old values need) and of its
// snapshot (bytes, sha256), taken as each was written, equals a read of the
// files whole (CheckJournal, snapshotdb.Digest); a journal changed after
// its writer closed it is read again, and what is recorded is the file as
// it is then.
func TestRunEndSumsAreTheFiles(t *testing.T) {
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		if _, err := cli.Put(ctx, fmt.Sprintf("/registry/secrets/ns/s-%03d", i), strings.Repeat("v", 1500)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := undo.StateDir(filepath.Join(t.TempDir(), "state")).Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()

	run := func(after func(r *undo.Run), wantErr string) *undo.Record {
		r, err := st.NewRun("migrate", nil, "/registry")
		if err != nil {
			t.Fatal(err)
		}
		first := &guard.FirstWrite{Client: cli, Snapshot: r.Snapshot}
		j, err := undo.OpenJournal(r.Journal)
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Open(ctx); err != nil {
			t.Fatal(err)
		}
		if err := j.Begin(7, "/registry"); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 40; i++ {
			key := fmt.Sprintf("/registry/secrets/ns/s-%03d", i)
			old := append([]byte("k8s:enc:aescbc:v1:key1:"), bytes.Repeat([]byte{byte(i)}, 48)...)
			if i%3 == 0 {
				old = []byte(`{"kind":"Secret"}`) // identity
			}
			if err := j.Intents([]etcdscan.Put{{Key: key, Value: []byte("new"), ModRevision: int64(10 + i)}}, [][]byte{old}); err != nil {
				t.Fatal(err)
			}
			if err := j.Done([]etcdscan.PutResult{{Key: key, Status: etcdscan.Written, NewModRevision: int64(400 + i)}}); err != nil {
				t.Fatal(err)
			}
		}
		// A quarantine's removal is put back as it was: it needs no key.
		if err := j.DeleteIntents([]undo.DeleteIntent{{Key: "/registry/secrets/ns/q", Value: []byte("k8s:enc:aescbc:v1:gone:xx"), ModRevision: 3, Reason: "unreadable"}}); err != nil {
			t.Fatal(err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		if after != nil {
			after(r)
		}
		if err := r.Finish(0, 40, nil); (err == nil) != (wantErr == "") || err != nil && !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("Finish: %v, want %q", err, wantErr)
		}
		recs, err := undo.StateDir(st.Dir).List()
		if err != nil {
			t.Fatal(err)
		}
		for i := range recs {
			if recs[i].ID == r.ID {
				return &recs[i]
			}
		}
		t.Fatalf("run %s not listed", r.ID)
		return nil
	}
	reread := func(rec *undo.Record) {
		t.Helper()
		jc, err := undo.CheckJournal(ctx, undo.JournalSpec{Path: rec.Journal}, undo.CheckOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := undo.FileSum{Bytes: jc.Bytes, SHA256: jc.SHA256, Records: jc.Records}
		if rec.JournalSum == nil || *rec.JournalSum != want {
			t.Errorf("run %s: journal recorded %+v, the file reads %+v", rec.ID, rec.JournalSum, want)
		}
		if !slices.Equal(rec.UndoNeedsKeys, jc.NeedsKeys()) || !slices.Equal(rec.UndoNeedsKeys, []string{"aescbc:key1", "identity"}) {
			t.Errorf("run %s: undo needs %v recorded, the file %v, want [aescbc:key1 identity]", rec.ID, rec.UndoNeedsKeys, jc.NeedsKeys())
		}
		d, err := snapshotdb.Digest(rec.Snapshot)
		if err != nil {
			t.Fatal(err)
		}
		if rec.SnapshotSum == nil || *rec.SnapshotSum != (undo.FileSum{Bytes: d.Size, SHA256: d.SHA256}) || !d.Trailer {
			t.Errorf("run %s: snapshot recorded %+v, the file reads %+v", rec.ID, rec.SnapshotSum, d)
		}
		// What runs --verify and a rollback compare with.
		if _, err := undo.CheckJournal(ctx, undo.JournalSpec{Path: rec.Journal, Record: rec}, undo.CheckOptions{}); err != nil {
			t.Errorf("run %s: the journal against its record: %v", rec.ID, err)
		}
		if _, err := undo.CheckSnapshot(rec.Snapshot, rec.SnapshotSum); err != nil {
			t.Errorf("run %s: the snapshot against its record: %v", rec.ID, err)
		}
	}

	rec := run(func(r *undo.Run) {
		// Taken as they were written: the end reads neither file.
		for _, p := range []string{r.Journal, r.Snapshot} {
			if !undo.WrittenKnown(p) {
				t.Errorf("%s: no checksum taken as it was written", p)
			}
		}
	}, "")
	if undo.Recall(rec.Journal) {
		t.Error("the journal's sums were left behind after the run's end")
	}
	reread(rec)

	// Another record appended after the writer closed (another writer given
	// the same file): the end reads the file as it is.
	rec = run(func(r *undo.Run) {
		j, err := undo.OpenJournal(r.Journal)
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Begin(8, "/registry"); err != nil {
			t.Fatal(err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}, "")
	if rec.JournalSum == nil || rec.JournalSum.Records != 40*2+1+1+1+2 {
		t.Errorf("appended journal: recorded %+v, want the records of both writers (%d)", rec.JournalSum, 40*2+3+2)
	}
	reread(rec)

	// A byte of an old value changed after the writer closed, the size
	// kept: not what was written; read again, it does not verify, and no
	// checksum is recorded for it.
	rec = run(func(r *undo.Run) {
		b, err := os.ReadFile(r.Journal)
		if err != nil {
			t.Fatal(err)
		}
		i := bytes.Index(b, []byte(`"oldValue":"`)) + len(`"oldValue":"`)
		b[i] ^= 'A' ^ 'B'
		if err := os.WriteFile(r.Journal, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}, "does not verify at its end")
	if rec.JournalSum != nil {
		t.Errorf("a journal changed after it was written: checksum %+v recorded", rec.JournalSum)
	}
}
