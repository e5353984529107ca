package undo

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
)

// writeJournal writes a journal of n rewrites of secrets (old values under
// aescbc:key1) and closes it.
func writeJournal(t *testing.T, path string, n int) {
	t.Helper()
	j, err := OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Begin(100, "/registry"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		key := "/registry/secrets/ns/s" + string(rune('a'+i))
		old := append([]byte("k8s:enc:aescbc:v1:key1:"), bytes.Repeat([]byte{byte(i)}, 64)...)
		if err := j.Intents([]etcdscan.Put{{Key: key, Value: []byte("new"), ModRevision: int64(10 + i)}}, [][]byte{old}); err != nil {
			t.Fatal(err)
		}
		if err := j.Done([]etcdscan.PutResult{{Key: key, Status: etcdscan.Written, NewModRevision: int64(200 + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}

func lines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(b, []byte("\n"))
}

func writeLines(t *testing.T, path string, ls [][]byte) {
	t.Helper()
	if err := os.WriteFile(path, bytes.Join(ls, nil), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestJournalVerifies: a journal as written verifies, with the keys its old
// values need; every kind of damage an operator may meet (a flipped bit in an
// old value, two records exchanged, one record's value under another key, a
// record removed, the file cut) is refused naming the journal, the line and
// the key; a record cut short at the end is passed over for a run that did
// not record its end and refused for one that did.
func TestJournalVerifies(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	good := filepath.Join(dir, "journal")
	writeJournal(t, good, 5)
	jc, err := CheckJournal(ctx, JournalSpec{Path: good}, CheckOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// begin, 5 x (intent, done), close
	if jc.Status != JournalVerified || jc.Records != 12 || !jc.Closed || jc.TornTail || strings.Join(jc.NeedsKeys(), ",") != "aescbc:key1" {
		t.Fatalf("good journal: %+v", jc)
	}
	end, code := time.Now(), 0
	sealed := &Record{Header: Header{ID: "0001-migrate", End: &end, ExitCode: &code}, JournalSum: &FileSum{Bytes: jc.Bytes, SHA256: jc.SHA256, Records: jc.Records}}
	if jc, err := CheckJournal(ctx, JournalSpec{Path: good, Record: sealed}, CheckOptions{}); err != nil || !jc.Sealed {
		t.Fatalf("sealed good journal: %+v %v", jc, err)
	}

	damaged := func(name string, edit func(ls [][]byte) [][]byte, run *Record, wantKey, wantWhy string) {
		t.Helper()
		path := filepath.Join(dir, name)
		writeLines(t, path, edit(lines(t, good)))
		_, err := CheckJournal(ctx, JournalSpec{Path: path, Record: run}, CheckOptions{})
		var de *JournalDamageError
		if !errors.As(err, &de) {
			t.Fatalf("%s: %v, want a damage error", name, err)
		}
		msg := de.Error()
		t.Logf("%s: %s", name, msg)
		if !strings.Contains(msg, "journal "+path+" is damaged") || (wantKey != "" && !strings.Contains(msg, wantKey)) || !strings.Contains(msg, wantWhy) {
			t.Errorf("%s: %s\nwant the journal, %q and %q", name, msg, wantKey, wantWhy)
		}
	}
	// One bit of the third record's old value (line 4: intent of sb).
	damaged("bitflip", func(ls [][]byte) [][]byte {
		l := ls[3]
		i := bytes.Index(l, []byte(`"oldValue":"`)) + len(`"oldValue":"`) + 10
		l[i] ^= 0x01
		return ls
	}, nil, "/registry/secrets/ns/sb", "checksum does not match")
	damaged("swapped", func(ls [][]byte) [][]byte {
		ls[3], ls[5] = ls[5], ls[3]
		return ls
	}, nil, "/registry/secrets/ns/sc", "where record 4 was expected")
	damaged("value-under-another-key", func(ls [][]byte) [][]byte {
		ls[3] = bytes.Replace(ls[3], []byte("/registry/secrets/ns/sb"), []byte("/registry/secrets/ns/sz"), 1)
		return ls
	}, nil, "/registry/secrets/ns/sz", "checksum does not match")
	damaged("removed", func(ls [][]byte) [][]byte {
		return append(ls[:3], ls[4:]...)
	}, nil, "/registry/secrets/ns/sb", "where record 4 was expected")
	// The file cut at a record boundary: a run that recorded its end knows its length.
	damaged("cut", func(ls [][]byte) [][]byte { return ls[:7] }, sealed, "", "cut short")
	// Cut inside a record: the run recorded its end, so it is no crash.
	damaged("torn-finished", func(ls [][]byte) [][]byte {
		ls[6] = ls[6][:20]
		return ls[:7]
	}, sealed, "", "cut short, but its run recorded its end")

	// The same cut in a killed run's journal: its last record is passed over.
	torn := filepath.Join(dir, "torn")
	ls := lines(t, good)
	ls[6] = ls[6][:20]
	writeLines(t, torn, ls[:7])
	killed := &Record{Header: Header{ID: "0001-migrate"}}
	jc, err = CheckJournal(ctx, JournalSpec{Path: torn, Record: killed}, CheckOptions{})
	if err != nil || !jc.TornTail || jc.Records != 6 || jc.Closed {
		t.Fatalf("killed run's torn journal: %+v %v", jc, err)
	}
	// A torn record followed by more is damage, whatever the run.
	writeLines(t, torn, append(ls[:7:7], []byte("\n"), lines(t, good)[7]))
	if _, err := CheckJournal(ctx, JournalSpec{Path: torn, Record: killed}, CheckOptions{}); err == nil {
		t.Fatal("a torn record inside the journal verified")
	}

	// Appending to a torn journal is refused; to a closed one the chain goes on.
	writeLines(t, torn, ls[:7])
	if _, err := OpenJournal(torn); err == nil || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("OpenJournal of a torn journal: %v", err)
	}
	writeJournal(t, good, 2)
	jc, err = CheckJournal(ctx, JournalSpec{Path: good}, CheckOptions{})
	if err != nil || jc.Records != 12+6 || jc.Status != JournalVerified {
		t.Fatalf("journal appended to: %+v %v", jc, err)
	}
}

// TestJournalWithoutChecksums: a journal written before checksums is read
// whole and said unverifiable, not damaged; a rollback refuses it unless
// allowed.
func TestJournalWithoutChecksums(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "journal")
	old := `{"op":"begin","revision":5,"prefix":"/registry"}
{"op":"intent","key":"/registry/secrets/ns/s1","oldModRevision":3,"oldValue":"azhzOmVuYzphZXNjYmM6djE6a2V5MTp4eHg=","newSha256":"00"}
{"op":"done","key":"/registry/secrets/ns/s1","newModRevision":6}
`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	jc, err := CheckJournal(ctx, JournalSpec{Path: path}, CheckOptions{})
	if err != nil || jc.Status != JournalUnverifiable || jc.Unchecked != 3 || strings.Join(jc.NeedsKeys(), ",") != "aescbc:key1" {
		t.Fatalf("legacy journal: %+v %v", jc, err)
	}
	u, err := CheckUndo(ctx, []JournalSpec{{Path: path}}, UndoOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ue *UnverifiedJournalError
	if !errors.As(u.Refusal(false), &ue) || u.Refusal(true) == nil {
		t.Fatalf("refusal: %v / %v", u.Refusal(false), u.Refusal(true))
	}
	// Accepted, the encrypted values still need a configuration to check them.
	var ne *NoEncryptionConfigError
	if !errors.As(u.Refusal(true), &ne) {
		t.Fatalf("allowed, no configuration: %v", u.Refusal(true))
	}
	// A writer appending to it starts a chain of its own after it.
	j, err := OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	jc, err = CheckJournal(ctx, JournalSpec{Path: path}, CheckOptions{})
	if err != nil || jc.Status != JournalUnverifiable || jc.Records != 4 || jc.Unchecked != 3 || !jc.Closed {
		t.Fatalf("legacy journal appended to: %+v %v", jc, err)
	}
}

// TestUnencryptedValuesNeedIdentity: kube-apiserver reads a value stored
// unencrypted only when the configuration for its resource lists identity
// (its prefix transformers match no prefix otherwise): a rollback that would
// put back an unencrypted secret under a configuration without identity is
// refused, naming identity; a resource the configuration does not name
// reads with identity. With no configuration given, unencrypted values are
// put back with a warning, encrypted ones refused.
func TestUnencryptedValuesNeedIdentity(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "enc.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - aescbc:
      keys:
      - name: key2
        secret: AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=
`), 0o600); err != nil {
		t.Fatal(err)
	}
	enc, err := encryption.Load(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	path := filepath.Join(dir, "journal")
	j, err := OpenJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	plain := []byte(`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"s1","namespace":"ns"}}`)
	cm := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"c1","namespace":"ns"}}`)
	if err := j.Intents([]etcdscan.Put{{Key: "/registry/secrets/ns/s1"}, {Key: "/registry/configmaps/ns/c1"}}, [][]byte{plain, cm}); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	u, err := CheckUndo(ctx, []JournalSpec{{Path: path}}, UndoOptions{CheckOptions: CheckOptions{Encryption: enc}, Configured: true})
	if err != nil {
		t.Fatal(err)
	}
	var ue *UnreadableValuesError
	if err := u.Refusal(false); !errors.As(err, &ue) || len(ue.Counts) != 1 || ue.Counts[0].Encryption != "identity" || ue.Counts[0].Values != 1 || ue.Counts[0].FirstKey != "/registry/secrets/ns/s1" {
		t.Fatalf("identity secret under a configuration without identity: %v", err)
	} else {
		t.Log(err)
	}
	if !strings.Contains(u.EncryptionLine(), "identity=1 (unreadable), identity=1 (readable)") {
		t.Errorf("encryption line: %s", u.EncryptionLine())
	}

	// No configuration: unencrypted values go back with a warning.
	u, err = CheckUndo(ctx, []JournalSpec{{Path: path}}, UndoOptions{})
	if err != nil || u.Refusal(false) != nil || !strings.Contains(u.Warning(input.Words), "the 2 value(s) put back are unencrypted (identity)") {
		t.Fatalf("no configuration, unencrypted values: %v, %v, %q", err, u.Refusal(false), u.Warning(input.Words))
	}
}
