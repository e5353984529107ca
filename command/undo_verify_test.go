package command

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/writerun"
)

// runsJSON is `runs -o json` (with args), its exit code and runs.
func runsJSON(t *testing.T, args ...string) (int, []writerun.RunView, string) {
	t.Helper()
	code, out, stderr := runCLI(t, append([]string{"runs", "-o", "json"}, args...)...)
	var listed struct {
		Runs []writerun.RunView `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("runs -o json %v: exit %d: %v\n%s%s", args, code, err, out, stderr)
	}
	return code, listed.Runs, out + stderr
}

// TestRollbackRefusesADamagedJournal: a run's journal damaged on disk (one
// bit of one record's old value flipped, so that it still reads as base64 and
// AES-CBC would decrypt it to garbage without a word; the file cut short; two
// records exchanged) makes `rollback --dry-run` and `rollback` refuse before
// any write: exit 1, etcd's revision unchanged, one line naming the journal,
// the first bad record's key and the way back (the run's snapshot, verified
// against the checksum recorded at the run's end). `runs --verify` says the
// run's undo does not verify (exit 1, undoVerified false). The journal put
// back as it was, the rollback restores every key byte for byte.
func TestRollbackRefusesADamagedJournal(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	const n = 200
	c.SeedMany(n, oldCfg)
	before := c.Raw()
	state := testcluster.StateDir(t)
	if code, out, stderr := runCLI(t, "migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	run := filepath.Join(state, "runs", "0001-migrate")
	journal := filepath.Join(run, undo.JournalFile)
	snapshot := filepath.Join(run, undo.SnapshotFile)
	pristine, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	code, runs, out := runsJSON(t, "--verify")
	if code != exitOK || len(runs) != 1 || runs[0].UndoVerified == nil || !*runs[0].UndoVerified || runs[0].JournalSum == nil || runs[0].SnapshotSum == nil ||
		strings.Join(runs[0].UndoNeedsKeys, ",") != "aescbc:key1,identity" {
		t.Fatalf("runs --verify of the migrate: exit %d\n%s", code, out)
	}
	if _, runs, out := runsJSON(t); runs[0].UndoVerified != nil || strings.Join(runs[0].UndoNeedsKeys, ",") != "aescbc:key1,identity" {
		t.Fatalf("runs without --verify: undoVerified set, or no undoNeedsKeys\n%s", out)
	}
	lines := bytes.SplitAfter(pristine, []byte("\n"))
	// The intents of secrets: the 3rd and 5th.
	var intents []int
	var keys []string
	for i, l := range lines {
		var r undo.JournalRecord
		if json.Unmarshal(l, &r) == nil && r.Op == "intent" && strings.HasPrefix(r.Key, "/registry/secrets/") {
			intents = append(intents, i)
			keys = append(keys, r.Key)
		}
	}
	if len(intents) < n {
		t.Fatalf("%d intents of secrets in the journal, want %d", len(intents), n)
	}
	damage := []struct {
		name    string
		edit    func() []byte
		key     string
		because string
	}{
		{"one bit of an old value", func() []byte {
			ls := bytes.SplitAfter(bytes.Clone(pristine), []byte("\n"))
			l := ls[intents[2]]
			i := bytes.Index(l, []byte(`"oldValue":"`)) + len(`"oldValue":"`) + 40
			for !(l[i] >= 'B' && l[i] <= 'Y' || l[i] >= 'b' && l[i] <= 'y') {
				i++
			}
			l[i] ^= 0x01 // still a base64 letter
			return bytes.Join(ls, nil)
		}, keys[2], "its checksum does not match its bytes"},
		{"cut short", func() []byte {
			return bytes.Join(lines[:intents[4]], nil)
		}, keys[3], "cut short"},
		{"two records exchanged", func() []byte {
			ls := bytes.SplitAfter(bytes.Clone(pristine), []byte("\n"))
			ls[intents[2]], ls[intents[4]] = ls[intents[4]], ls[intents[2]]
			return bytes.Join(ls, nil)
		}, keys[4], "records reordered, removed or repeated"},
	}
	for _, d := range damage {
		if err := os.WriteFile(journal, d.edit(), 0o600); err != nil {
			t.Fatal(err)
		}
		rev := c.Revision()
		for _, dry := range [][]string{{"--dry-run"}, nil} {
			code, out, stderr := runCLI(t, append([]string{"rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "500ms"}, dry...)...)
			if code != exitError || !strings.Contains(stderr, "journal "+journal+" is damaged") || !strings.Contains(stderr, d.key+":") && !strings.Contains(stderr, d.key+" ") ||
				!strings.Contains(stderr, d.because) || !strings.Contains(stderr, "nothing was written") ||
				!strings.Contains(stderr, "run 0001-migrate's snapshot "+snapshot+" is the way back") || !strings.Contains(stderr, "matches the checksum recorded at its run's end") {
				t.Fatalf("rollback %v of a journal with %s: exit %d, want %d naming the journal, %s, %q and the verified snapshot\n%s%s", dry, d.name, code, exitError, d.key, d.because, out, stderr)
			}
			if strings.Count(stderr, "\n") != 1 {
				t.Errorf("rollback %v of a journal with %s: the refusal is not one line:\n%s", dry, d.name, stderr)
			}
			if c.Revision() != rev {
				t.Fatalf("rollback %v of a journal with %s wrote: revision %d -> %d", dry, d.name, rev, c.Revision())
			}
		}
		code, runs, out := runsJSON(t, "--verify")
		if code != exitError || len(runs) != 1 || runs[0].UndoVerified == nil || *runs[0].UndoVerified || runs[0].UndoCheck.Status != undo.UndoDamaged {
			t.Fatalf("runs --verify of a journal with %s: exit %d\n%s", d.name, code, out)
		}
		if code, out, _ := runCLI(t, "runs", "--verify"); code != exitError || !strings.Contains(out, "0001-migrate: DAMAGED: journal "+journal+" is damaged") || !strings.Contains(out, "0001-migrate: the way back: run 0001-migrate's snapshot "+snapshot) {
			t.Fatalf("runs --verify (table) of a journal with %s: exit %d\n%s", d.name, code, out)
		}
	}
	if _, err := os.Stat(filepath.Join(state, "runs", "0002-rollback")); err == nil {
		t.Fatal("a refused rollback left a run directory")
	}

	if err := os.WriteFile(journal, pristine, 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "500ms")
	if code != exitOK || !strings.Contains(out, "preflight: journal "+journal+" (run 0001-migrate): verified: ") || !strings.Contains(out, "bytes matching the sha256 recorded at the run's end") {
		t.Fatalf("rollback of the journal as it was: exit %d\n%s%s", code, out, stderr)
	}
	c.RequireBack(before)
}

// TestRollbackRefusesValuesNoKeyReads is the key retirement an operator may
// do too early: secrets rotated from key1 to key2 by migrate, then key1
// removed from the configuration. `rollback` with the key2-only
// configuration would put back values under key1 nothing can read: it and
// its dry run refuse before any write, naming aescbc:key1 and how many
// values need it; without any configuration it is refused too, naming the
// flags (exit 2). `runs` says the run's undo needs aescbc:key1, and the
// key-retirement gate pointed at the state directory (`verify
// --snapshot-file STATE_DIR`) finds the run's snapshot and journal need it
// (exit 4). With [key2, key1] the gate passes and the rollback restores
// every key byte for byte.
func TestRollbackRefusesValuesNoKeyReads(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	key2Only := c.EncryptionConfig("key2-only.yaml", testcluster.AESCBC("key2", 2))
	const n = 150
	c.SeedMany(n, oldCfg)
	before := c.Raw()
	state := testcluster.StateDir(t)
	if code, out, stderr := runCLI(t, "migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	migrated, rev := c.Raw(), c.Revision()
	run := filepath.Join(state, "runs", "0001-migrate")

	for _, dry := range [][]string{{"--dry-run"}, nil} {
		code, out, stderr := runCLI(t, append([]string{"rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", key2Only, "--run", "1", "--liveness-window", "500ms"}, dry...)...)
		want := fmt.Sprintf("rollback would put back %d value(s) that the encryption configuration %s cannot decrypt: %d under aescbc:key1", n, key2Only, n)
		if code != exitError || !strings.Contains(stderr, want) || !strings.Contains(stderr, "nothing was written") {
			t.Fatalf("rollback %v with key1 retired: exit %d, want %d and %q\n%s%s", dry, code, exitError, want, out, stderr)
		}
		if dry != nil && !strings.Contains(out, fmt.Sprintf("aescbc:key1=%d (unreadable)", n)) {
			t.Errorf("the dry run does not show the values key1 is needed for:\n%s", out)
		}
		if c.Revision() != rev {
			t.Fatalf("rollback %v with key1 retired wrote", dry)
		}
	}
	code, out, stderr := runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--run", "1", "--liveness-window", "500ms")
	if code != exitUsage || !strings.Contains(stderr, fmt.Sprintf("aescbc:key1=%d", n)) || !strings.Contains(stderr, "--apiserver-manifest") || !strings.Contains(stderr, "--encryption-provider-config") || c.Revision() != rev {
		t.Fatalf("rollback with no configuration: exit %d, want %d naming the flags\n%s%s", code, exitUsage, out, stderr)
	}

	// The gate over the state directory itself.
	code, out, stderr = runCLI(t, "verify", "--snapshot-file", state, "--encryption-provider-config", key2Only, "--target-version", "1.37")
	if code != exitUnreadable || !strings.Contains(out, filepath.Join(run, undo.SnapshotFile)+" of run 0001-migrate (aescbc:key1)") ||
		!strings.Contains(out, filepath.Join(run, undo.JournalFile)+" of run 0001-migrate (aescbc:key1)") {
		t.Fatalf("verify --snapshot-file STATE_DIR with key1 retired: exit %d, want %d naming the run's snapshot and journal\n%s%s", code, exitUnreadable, out, stderr)
	}
	if !strings.Contains(out, fmt.Sprintf("aescbc:key1=%d (unreadable)", n)) {
		t.Errorf("the gate does not count the values under key1:\n%s", out)
	}
	code, out, stderr = runCLI(t, "verify", "--snapshot-file", state, "--encryption-provider-config", newCfg, "--target-version", "1.37", "-o", "json")
	var rep filesReport
	if code != exitStale || json.Unmarshal([]byte(out), &rep) != nil || len(rep.Files) != 2 || rep.Files[1].Kind != "journal" || rep.Files[1].Exit != exitOK || rep.Files[1].RunID != "0001-migrate" {
		t.Fatalf("verify --snapshot-file STATE_DIR with [key2, key1]: exit %d, want %d (the snapshot stale, the journal readable)\n%s%s", code, exitStale, out, stderr)
	}
	_, runs, out := runsJSON(t)
	if len(runs) != 1 || strings.Join(runs[0].UndoNeedsKeys, ",") != "aescbc:key1,identity" {
		t.Fatalf("runs: undoNeedsKeys\n%s", out)
	}
	for k, v := range migrated {
		if c.Raw()[k] != v {
			t.Fatalf("%s changed before the rollback", k)
		}
	}

	code, out, stderr = runCLI(t, "rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "500ms")
	if code != exitOK || !strings.Contains(out, fmt.Sprintf("aescbc:key1=%d (readable)", n)) {
		t.Fatalf("rollback with [key2, key1]: exit %d\n%s%s", code, out, stderr)
	}
	c.RequireBack(before)
}

// TestRollbackOfAJournalWithoutChecksums: a run whose journal and record
// were written by a release before checksums (0.2.0's `migrate --journal`
// wrote the same records without seq and sum). `runs --verify` says its undo
// is unverifiable (exit 0: nothing is known to be wrong), `rollback` refuses
// it before any write naming --allow-unverified-journal, and with that flag
// puts every key back byte for byte, saying the journal was not verified.
func TestRollbackOfAJournalWithoutChecksums(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	c.SeedMany(50, oldCfg)
	before := c.Raw()
	state := testcluster.StateDir(t)
	if code, out, stderr := runCLI(t, "migrate", "--liveness-window", "500ms", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--target-version", "1.37"); code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	// The journal and run.json as a release before checksums wrote them.
	run := filepath.Join(state, "runs", "0001-migrate")
	journal := filepath.Join(run, undo.JournalFile)
	b, err := os.ReadFile(journal)
	if err != nil {
		t.Fatal(err)
	}
	var legacy []byte
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		if m["op"] == "close" {
			continue
		}
		delete(m, "seq")
		delete(m, "sum")
		out, _ := json.Marshal(m)
		legacy = append(append(legacy, out...), '\n')
	}
	if err := os.WriteFile(journal, legacy, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err = os.ReadFile(filepath.Join(run, undo.RecordFile))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"journalSum", "snapshotSum", "undoNeedsKeys"} {
		delete(rec, f)
	}
	b, _ = json.Marshal(rec)
	if err := os.WriteFile(filepath.Join(run, undo.RecordFile), b, 0o600); err != nil {
		t.Fatal(err)
	}

	code, runs, out := runsJSON(t, "--verify")
	if code != exitOK || len(runs) != 1 || runs[0].UndoVerified == nil || *runs[0].UndoVerified || runs[0].UndoCheck.Status != undo.UndoUnverifiable {
		t.Fatalf("runs --verify of a journal without checksums: exit %d\n%s", code, out)
	}
	rev := c.Revision()
	args := []string{"rollback", "--endpoints", c.Srv.Endpoint, "--encryption-provider-config", newCfg, "--run", "1", "--liveness-window", "500ms"}
	code, out, stderr := runCLI(t, args...)
	if code != exitError || !strings.Contains(stderr, "journal "+journal+" has no checksums") || !strings.Contains(stderr, "--allow-unverified-journal") || c.Revision() != rev {
		t.Fatalf("rollback of a journal without checksums: exit %d, want %d naming --allow-unverified-journal\n%s%s", code, exitError, out, stderr)
	}
	code, out, stderr = runCLI(t, append(args, "--allow-unverified-journal")...)
	if code != exitOK || !strings.Contains(out, "preflight: journal "+journal+" (run 0001-migrate): UNVERIFIED: ") {
		t.Fatalf("rollback --allow-unverified-journal: exit %d\n%s%s", code, out, stderr)
	}
	after := c.Raw()
	for k, v := range before {
		if after[k] != v {
			t.Fatalf("%s: not back byte for byte", k)
		}
	}
}
