package undo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/etcdscan"
)

// realRun makes a state directory as runs leave it: a migrate run that
// journaled a rewrite, a delete and a creation and recorded its end, a
// rollback run killed before its end (its journal's last record cut short),
// and the runs.log of both. It returns the state directory and the first
// run's record.
func realRun(f *testing.F) (string, *Run) {
	f.Helper()
	dir := filepath.Join(f.TempDir(), "state")
	st, err := StateDir(dir).Open()
	if err != nil {
		f.Fatal(err)
	}
	defer st.Close()
	run, err := st.NewRun("migrate", []string{"https://10.0.0.1:2379"}, "/registry")
	if err != nil {
		f.Fatal(err)
	}
	j, err := OpenJournal(run.Journal)
	if err != nil {
		f.Fatal(err)
	}
	key := "/registry/secrets/kube-system/bootstrap-token-abcdef"
	steps := []error{
		j.Begin(412, "/registry"),
		j.Intents([]etcdscan.Put{{Key: key, Value: []byte("k8s:enc:aescbc:v1:key2:new"), ModRevision: 17}},
			[][]byte{append([]byte("k8s:enc:aescbc:v1:key1:"), bytes.Repeat([]byte{0xa5}, 48)...)}),
		j.Done([]etcdscan.PutResult{{Key: key, Status: etcdscan.Written, NewModRevision: 413}}),
		j.Intents([]etcdscan.Put{{Key: "/registry/configmaps/default/plain", Value: []byte("k8s\x00new"), ModRevision: 20}},
			[][]byte{[]byte("k8s\x00\n\x0f\n\x02v1\x12\tConfigMap")}),
		j.Done([]etcdscan.PutResult{{Key: "/registry/configmaps/default/plain", Status: etcdscan.Conflict}}),
		j.DeleteIntents([]DeleteIntent{{Key: "/registry/widgets/ns/w", Value: []byte("{}"), ModRevision: 30, CreateRevision: 29, Version: 2, Lease: 7, Reason: "orphaned"}}),
		j.Deleted([]etcdscan.PutResult{{Key: "/registry/widgets/ns/w", Status: etcdscan.Written, NewModRevision: 414}}),
		j.Close(),
		run.Finish(0, 1, map[string]int{"written": 1}),
	}
	for _, err := range steps {
		if err != nil {
			f.Fatal(err)
		}
	}
	killed, err := st.NewRun("rollback", []string{"https://10.0.0.1:2379"}, "/registry")
	if err != nil {
		f.Fatal(err)
	}
	if err := killed.SetUndoes([]string{run.ID}); err != nil {
		f.Fatal(err)
	}
	jk, err := OpenJournal(killed.Journal)
	if err != nil {
		f.Fatal(err)
	}
	if err := jk.BeginCommand("rollback", 414, "/registry"); err != nil {
		f.Fatal(err)
	}
	if err := jk.Intents([]etcdscan.Put{{Key: key, Value: []byte("old"), ModRevision: 413}}, [][]byte{[]byte("k8s:enc:aescbc:v1:key2:new")}); err != nil {
		f.Fatal(err)
	}
	if err := jk.Close(); err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(killed.Journal)
	if err != nil {
		f.Fatal(err)
	}
	if err := os.WriteFile(killed.Journal, b[:len(b)-20], 0o600); err != nil {
		f.Fatal(err)
	}
	killed.Release()
	return dir, run
}

// readFile is a file's bytes, failing the fuzz test on an error.
func readFile(f *testing.F, path string) []byte {
	f.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// hangGuard panics (which the fuzzing engine records with the input) when
// what follows it has not returned within a minute: fuzzing has no deadline
// of its own per input.
func hangGuard(what string, data []byte) *time.Timer {
	return time.AfterFunc(time.Minute, func() { panic(fmt.Sprintf("%s hangs on %q", what, data)) })
}

// oneLineNaming fails t unless err is one line that names path.
func oneLineNaming(t *testing.T, what string, err error, path string) {
	t.Helper()
	if err == nil {
		return
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") || !strings.Contains(msg, path) {
		t.Fatalf("%s: %q: want one line naming %s", what, msg, path)
	}
}

// FuzzJournal reads arbitrary bytes as a run's journal with every reader of
// journals: the whole-file check rollback and 'runs --verify' make (as the
// journal of a run that recorded its end and of one that did not), the
// reader of its records, the prefix and size reads rollback makes before
// it, the backward reader rollback undoes with, and the tail read a
// journal appended to starts from. Nothing panics or hangs; each error is
// one line naming the file. The seeds are journals the journal writer
// wrote (a finished run's, a killed run's cut short) and damaged copies of
// them (testdata/fuzz/FuzzJournal holds what fuzzing found).
func FuzzJournal(f *testing.F) {
	dir, run := realRun(f)
	good := readFile(f, run.Journal)
	f.Add(good)
	f.Add(readFile(f, filepath.Join(dir, runsDir, "0002-rollback", JournalFile)))
	f.Add(good[:len(good)/2])
	flipped := bytes.Clone(good)
	flipped[len(flipped)/3] ^= 0x20
	f.Add(flipped)
	f.Add([]byte("{\"seq\":1,\"op\":\"begin\"}\n\n\n{\"op\":\"intent\",\"key\":\"/registry/a\",\"oldValue\":\"!!\"}\n"))
	f.Add([]byte{})
	rec := run.Record
	f.Fuzz(func(t *testing.T, data []byte) {
		defer hangGuard("reading a journal", data).Stop()
		path := filepath.Join(t.TempDir(), JournalFile)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, spec := range []JournalSpec{{Path: path}, {Path: path, Record: &rec}} {
			jc, err := CheckJournal(ctx, spec, CheckOptions{})
			oneLineNaming(t, "CheckJournal", err, path)
			if err == nil {
				if l := jc.Line(); strings.Contains(l, "\n") {
					t.Fatalf("CheckJournal's line is not one line: %q", l)
				}
				if jc.Bytes > int64(len(data)) {
					t.Fatalf("CheckJournal read %d bytes of a %d-byte file", jc.Bytes, len(data))
				}
			}
		}
		oneLineNaming(t, "ReadJournal", ReadJournal(path, func(JournalRecord) error { return nil }), path)
		_ = JournalsPrefix([]string{path})
		if n, err := UndoWrites([]string{path}, func(k, v int) int64 { return int64(k + v) }); err != nil || n < 0 {
			t.Fatalf("UndoWrites: %d, %v", n, err)
		}
		fh, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		br, err := newBackwardReader(fh)
		if err != nil {
			t.Fatal(err)
		}
		read := 0
		for {
			line, off, err := br.Next()
			if err != nil {
				break
			}
			if off < 0 || off+int64(len(line)) > int64(len(data)) || !bytes.Equal(data[off:off+int64(len(line))], line) {
				t.Fatalf("the backward reader returned %q at byte %d, not what the file holds there", line, off)
			}
			if read += len(line); read > len(data) {
				t.Fatalf("the backward reader returned more bytes than the file holds")
			}
		}
		fh.Close()
		j, err := OpenJournal(path)
		oneLineNaming(t, "OpenJournal", err, path)
		if err == nil {
			if err := j.Close(); err != nil {
				t.Fatalf("closing a journal opened to append: %v", err)
			}
		}
	})
}

// FuzzRunRecords reads arbitrary bytes as a run directory's record
// (run.json) and as the state directory's log (runs.log), beside a run
// whose record is intact, with what 'runs', 'runs --verify', 'runs
// --prune' and 'rollback --run' read them with: the listing, the runs
// missing from it, the runs from a given one on, each run's state and the
// check of its journal and snapshot, the runs' groups and what a prune
// would remove. Nothing panics or hangs, nothing grows without bound; each
// error is one line naming the state directory. The seeds are the records
// and log real runs wrote (a finished migrate, a killed rollback).
func FuzzRunRecords(f *testing.F) {
	dir, run := realRun(f)
	goodRec := readFile(f, filepath.Join(run.Dir, RecordFile))
	killedRec := readFile(f, filepath.Join(dir, runsDir, "0002-rollback", RecordFile))
	log := readFile(f, filepath.Join(dir, logFile))
	f.Add(goodRec, log)
	f.Add(killedRec, log)
	f.Add(goodRec[:len(goodRec)/2], log[:len(log)/2])
	f.Add([]byte("{}"), []byte("{\"id\":\"0009-migrate\",\"seq\":9,\"event\":\"start\"}\n"))
	f.Add([]byte("null"), []byte("\n\n{\"id\":\"0001-migrate\",\"seq\":1,\"event\":\"end\",\"exitCode\":0}"))
	// A run number far past the runs that exist: Missing listed every
	// number in between.
	f.Add(goodRec, []byte("{\"id\":\"999999999-migrate\",\"seq\":999999999,\"event\":\"start\"}\n"))
	f.Fuzz(func(t *testing.T, record, logData []byte) {
		defer hangGuard("reading a state directory", append(append(record[:len(record):len(record)], 0), logData...)).Stop()
		state := filepath.Join(t.TempDir(), "state")
		first := filepath.Join(state, runsDir, "0001-migrate")
		second := filepath.Join(state, runsDir, "0003-migrate")
		for _, d := range []string{first, second} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		intact := bytes.ReplaceAll(goodRec, []byte(run.Dir), []byte(second))
		intact = bytes.ReplaceAll(intact, []byte(`"0001-migrate"`), []byte(`"0003-migrate"`))
		intact = bytes.Replace(intact, []byte(`"seq": 1,`), []byte(`"seq": 3,`), 1)
		for path, b := range map[string][]byte{
			filepath.Join(first, RecordFile):  record,
			filepath.Join(second, RecordFile): intact,
			filepath.Join(state, logFile):     logData,
		} {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		d := StateDir(state)
		recs, err := d.List()
		oneLineNaming(t, "List", err, state)
		if err != nil {
			return
		}
		if len(recs) != 2 || recs[1].ID != "0003-migrate" {
			t.Fatalf("List: %d run(s), want the two directories", len(recs))
		}
		for _, r := range recs {
			if strings.Contains(r.Command, "\n") {
				t.Fatalf("a record listed with a command of several lines: %q", r.Command)
			}
			_ = r.State()
			_ = r.Finished()
			// Its journal and snapshot are checked where they are inside
			// the state directory (a record naming another file is checked
			// against that file: not this test's business).
			if inside(state, r.Journal) && inside(state, r.Snapshot) {
				rc := CheckRun(context.Background(), r)
				for _, p := range rc.Problems {
					if strings.Contains(p, "\n") {
						t.Fatalf("CheckRun: a problem of several lines: %q", p)
					}
				}
			}
		}
		missing, err := d.Missing(recs)
		oneLineNaming(t, "Missing", err, state)
		if len(missing) > maxMissingRuns {
			t.Fatalf("Missing: %d runs listed", len(missing))
		}
		for _, id := range []string{"1", "0001-migrate", "3"} {
			_, err := d.Since(id)
			oneLineNaming(t, "Since("+id+")", err, state)
		}
		_ = Groups(recs)
		for _, opts := range []PruneOptions{{Keep: 1, DryRun: true}, {Before: "3", DryRun: true}} {
			if _, err := d.Prune(opts); err != nil && strings.Contains(err.Error(), "\n") {
				t.Fatalf("Prune(%+v): %q: want one line", opts, err)
			}
		}
	})
}

// inside says whether path is in dir (or is "").
func inside(dir, path string) bool {
	if path == "" {
		return true
	}
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}
