package undo

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"sync"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/dropbehind"
	"kube-etcd-migrate/internal/input"
)

// JournalRecord is one line of a journal (JSON lines). An "intent" record is
// written and synced before the write is sent; a "done" record after it landed.
// A delete (quarantine) is journaled the same way as "delete-intent", with the
// key's lease and revisions, and "deleted". OldValue holds the stored bytes
// exactly as they were, still encrypted if they were: a journal of
// identity-stored secrets holds those secrets, hence mode 0600. Readers ignore
// fields and ops they do not know. Seq and Sum chain the records (see
// "Journal format" in the package doc); a "close" record is appended when a
// writer closes the journal. appendRecord (record.go) writes its members by
// hand, as encoding/json does: a member added here is added there too
// (TestRecordFieldsKnown fails until it is).
type JournalRecord struct {
	// Seq numbers the records of the journal from 1 (0 in a journal written
	// before records were checksummed).
	Seq            int64  `json:"seq,omitempty"`
	Op             string `json:"op"` // "begin", "intent", "done", "delete-intent", "deleted", "create-intent", "close"
	Key            string `json:"key,omitempty"`
	OldModRevision int64  `json:"oldModRevision,omitempty"`
	OldValue       []byte `json:"oldValue,omitempty"`
	// NewSHA256 identifies the value the tool wrote, so a rollback can tell its own
	// write from someone else's when the "done" record is missing (crash).
	NewSHA256      string `json:"newSha256,omitempty"`
	NewModRevision int64  `json:"newModRevision,omitempty"`
	// Begin record fields. Command is "quarantine" for a quarantine's journal,
	// absent for migrate's.
	Revision int64  `json:"revision,omitempty"`
	Prefix   string `json:"prefix,omitempty"`
	Command  string `json:"command,omitempty"`
	// Delete records: what etcd kept with the value, and why it was removed.
	OldCreateRevision int64  `json:"oldCreateRevision,omitempty"`
	OldVersion        int64  `json:"oldVersion,omitempty"`
	Lease             int64  `json:"lease,omitempty"`
	Reason            string `json:"reason,omitempty"`
	DeleteRevision    int64  `json:"deleteRevision,omitempty"`
	// Sum is the record's checksum, always its last member (chainSum).
	Sum string `json:"sum,omitempty"`
}

// Journal appends records to a file, syncing each batch of intents before the
// batch is written. Each record gets the next sequence number and its
// checksum, chained to the previous record's (a journal appended to goes on
// from its last record); Close appends a "close" record.
//
// The syncs are a group commit: a batch's records are written to the file
// under the journal's lock, and its sync, outside it, waits for the sync in
// progress and then covers every record written by then, so the batches in
// flight share one fsync instead of taking turns for their own. A failed
// write or sync fails every append after it: what the file holds after a
// failed fsync is not known.
type Journal struct {
	mu   sync.Mutex
	path string

	// syncMu is held by the one sync in progress; synced is the last
	// record it made durable, err the first failure (both under syncMu).
	// written is the last record written to the file (under mu).
	syncMu  sync.Mutex
	synced  int64
	dropped int64 // the file's bytes last dropped from the page cache (under syncMu)
	written int64
	err     error

	f     *os.File
	w     *bufio.Writer
	buf   bytes.Buffer
	enc   *json.Encoder // into buf, for a record appendRecord does not write
	line  []byte        // the record being written
	chain hash.Hash     // its checksum's digest
	seq   int64
	prev  [sha256.Size]byte

	// What was written, for the run's end (Seal): the file's sha256, bytes
	// and records, and the old values' providers and keys, counted as the
	// records are appended. whole: the file was empty when opened (else
	// its earlier records are not counted here); failed: a write failed.
	whole, failed bool
	hash          hash.Hash
	bytes         int64
	records       int64
	values        *valueCheck
}

// OpenJournal creates (or appends to) a journal file with mode 0600. A journal
// that ends with a record cut short (its writer was killed while appending it)
// is refused: a record after it would leave a damaged one inside the journal.
func OpenJournal(path string) (*Journal, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, input.Errorf("%s %s: %w", input.Journal, path, err)
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		f.Close()
		return nil, input.Errorf("%s %s: file is readable by others (mode %v); it will hold stored values, use a file with mode 0600", input.Journal, path, fi.Mode().Perm())
	}
	seq, prev, err := journalTail(f)
	if err != nil {
		f.Close()
		return nil, input.Errorf("%s %s: %w", input.Journal, path, err)
	}
	forget(path)
	j := &Journal{path: path, f: f, w: bufio.NewWriterSize(f, 1<<20), seq: seq, prev: prev,
		whole: seq == 0 && fileEmpty(f), hash: sha256.New(), values: newValueCheck(CheckOptions{})}
	j.enc = json.NewEncoder(&j.buf)
	return j, nil
}

func fileEmpty(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Size() == 0
}

// journalTail is the sequence number and checksum a record appended to the
// journal f chains to: those of its last record, or none (0) when it is empty
// or its last record has no checksum (a journal written before checksums: a
// new chain starts).
func journalTail(f *os.File) (int64, [sha256.Size]byte, error) {
	var none [sha256.Size]byte
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0, none, err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, fi.Size()-1); err != nil {
		return 0, none, err
	}
	if last[0] != '\n' {
		return 0, none, errors.New("it ends with a record cut short (a run was killed while writing it): undo that run first (rollback), or give a new journal file")
	}
	br, err := newBackwardReader(f)
	if err != nil {
		return 0, none, err
	}
	line, off, err := br.Next()
	if err != nil {
		return 0, none, err
	}
	_, sum, ok := splitSum(line)
	if !ok {
		return 0, none, nil
	}
	var r struct {
		Seq int64 `json:"seq"`
	}
	if err := json.Unmarshal(line, &r); err != nil || r.Seq <= 0 {
		return 0, none, fmt.Errorf("its last record (byte %d) does not read: the journal is damaged", off)
	}
	return r.Seq, sum, nil
}

// Begin records the start of a run.
func (j *Journal) Begin(revision int64, prefix string) error {
	return j.append(true, JournalRecord{Op: "begin", Revision: revision, Prefix: prefix})
}

// BeginCommand records the start of a run of another command than migrate.
func (j *Journal) BeginCommand(command string, revision int64, prefix string) error {
	return j.append(true, JournalRecord{Op: "begin", Command: command, Revision: revision, Prefix: prefix})
}

// BeginJournal opens the journal at path (OpenJournal) for a run of
// command, and writes its begin record: etcd's revision when the run read
// it, and kube-apiserver's prefix.
func BeginJournal(path, command string, revision int64, prefix string) (*Journal, error) {
	j, err := OpenJournal(path)
	if err != nil {
		return nil, err
	}
	if err := j.BeginCommand(command, revision, prefix); err != nil {
		j.Close()
		return nil, err
	}
	return j, nil
}

// DeleteIntent is a key about to be deleted, as it is stored.
type DeleteIntent struct {
	Key                                  string
	Value                                []byte
	ModRevision, CreateRevision, Version int64
	Lease                                int64
	Reason                               string
}

// DeleteIntents records, durably, the keys of a batch about to be deleted:
// value, lease and revisions.
func (j *Journal) DeleteIntents(ds []DeleteIntent) error {
	recs := make([]JournalRecord, len(ds))
	for i, d := range ds {
		recs[i] = JournalRecord{Op: "delete-intent", Key: d.Key, OldValue: d.Value, OldModRevision: d.ModRevision,
			OldCreateRevision: d.CreateRevision, OldVersion: d.Version, Lease: d.Lease, Reason: d.Reason}
	}
	return j.append(true, recs...)
}

// Deleted records deletes that landed. It is synced by the next intents or Close.
func (j *Journal) Deleted(results []etcdscan.PutResult) error {
	var recs []JournalRecord
	for _, r := range results {
		if r.Status == etcdscan.Written {
			recs = append(recs, JournalRecord{Op: "deleted", Key: r.Key, DeleteRevision: r.NewModRevision})
		}
	}
	return j.append(false, recs...)
}

// Intents records, durably, the old values of a batch about to be written.
func (j *Journal) Intents(puts []etcdscan.Put, old [][]byte) error {
	recs := make([]JournalRecord, len(puts))
	for i, p := range puts {
		sum := sha256.Sum256(p.Value)
		recs[i] = JournalRecord{Op: "intent", Key: p.Key, OldModRevision: p.ModRevision, OldValue: old[i], NewSHA256: hex.EncodeToString(sum[:])}
	}
	return j.append(true, recs...)
}

// Done records writes that landed. It is synced by the next Intents or Close.
func (j *Journal) Done(results []etcdscan.PutResult) error {
	var recs []JournalRecord
	for _, r := range results {
		if r.Status == etcdscan.Written {
			recs = append(recs, JournalRecord{Op: "done", Key: r.Key, NewModRevision: r.NewModRevision})
		}
	}
	return j.append(false, recs...)
}

// Append records recs; with sync, durably (an intent before its write: the
// batches in flight share their fsync), else with the next sync or Close
// (what landed). A rollback journals its own undo so.
func (j *Journal) Append(sync bool, recs ...JournalRecord) error { return j.append(sync, recs...) }

func (j *Journal) append(sync bool, recs ...JournalRecord) error {
	j.mu.Lock()
	if j.failed {
		j.mu.Unlock()
		return j.failure()
	}
	for _, r := range recs {
		if err := j.write(r); err != nil {
			return j.fail(err)
		}
	}
	if !sync {
		j.mu.Unlock()
		return nil
	}
	if err := j.w.Flush(); err != nil {
		return j.fail(err)
	}
	j.written = j.seq
	last := j.seq
	j.mu.Unlock()
	return j.syncTo(last)
}

// syncFile makes a journal's file durable (a test counts the calls).
var syncFile = (*os.File).Sync

// fail records err as the journal's failure, unlocks mu (held by the
// caller) and returns the failure.
func (j *Journal) fail(err error) error {
	j.failed = true
	j.mu.Unlock()
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.err == nil {
		j.err = fmt.Errorf("journal %s: %w", j.path, err)
	}
	return j.err
}

// failure is the error that failed the journal.
func (j *Journal) failure() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.err == nil {
		return fmt.Errorf("journal %s: an earlier write failed", j.path)
	}
	return j.err
}

// syncTo returns once the records up to seq are durable: at once when a
// sync since they were written covered them, else after a sync of its own,
// which covers every record written to the file before it starts.
func (j *Journal) syncTo(seq int64) error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	if j.err != nil {
		return j.err
	}
	if j.synced >= seq {
		return nil
	}
	j.mu.Lock()
	upTo := j.written
	j.mu.Unlock()
	if err := syncFile(j.f); err != nil {
		j.mu.Lock()
		j.failed = true
		j.mu.Unlock()
		j.err = fmt.Errorf("journal %s: %w", j.path, err)
		return j.err
	}
	j.synced = upTo
	// What is on disk leaves the page cache (a rollback reads it from
	// disk): a journal of millions of old values would evict etcd's
	// database from it (dropbehind says why).
	if off, err := j.f.Seek(0, io.SeekCurrent); err == nil && off-j.dropped >= journalDropEvery {
		dropbehind.Drop(j.f, 0, off)
		j.dropped = off
	}
	return nil
}

// journalDropEvery is how much a journal grows between two drops of its
// synced pages from the page cache.
const journalDropEvery = 8 << 20

// write appends one record with the next sequence number and its checksum:
// the record's JSON object without its closing brace (P), then
// ,"sum":"<hex of sha256(previous record's sum || P)>"} and a newline.
func (j *Journal) write(r JournalRecord) error {
	r.Seq, r.Sum = j.seq+1, ""
	p, ok := appendRecord(j.line[:0], &r)
	if !ok {
		j.buf.Reset()
		if err := j.enc.Encode(r); err != nil {
			return err
		}
		p = append(p[:0], bytes.TrimSuffix(j.buf.Bytes(), []byte("}\n"))...)
	}
	sum := j.chainSum(p)
	line := append(p, sumMember...)
	line = hex.AppendEncode(line, sum[:])
	line = append(line, "\"}\n"...)
	if cap(line) <= 1<<20 {
		j.line = line[:0] // the next record's (a large one's is not kept)
	}
	if _, err := j.w.Write(line); err != nil {
		return err
	}
	j.seq, j.prev = r.Seq, sum
	j.hash.Write(line)
	j.bytes += int64(len(line))
	j.records++
	if r.Op == "intent" || r.Op == "delete-intent" {
		// As CheckJournal counts them, without an encryption configuration
		// (by envelope: it never fails).
		_ = j.values.add(context.Background(), &checkRecord{Op: r.Op, Key: r.Key, Reason: r.Reason}, r.OldValue)
	}
	return nil
}

// sumMember starts a record's checksum, its last member.
const sumMember = `,"sum":"`

// sumSuffixLen is the length of a record's checksum member and closing brace.
const sumSuffixLen = len(sumMember) + 2*sha256.Size + len(`"}`)

// chainSum is a record's checksum: the sha256 of the previous record's
// checksum (32 zero bytes for the first record) followed by the record's
// bytes before its checksum member.
func chainSum(prev [sha256.Size]byte, p []byte) [sha256.Size]byte {
	h := sha256.New()
	h.Write(prev[:])
	h.Write(p)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// chainSum is the checksum of the journal's next record, P (chainSum),
// taken with the journal's one digest.
func (j *Journal) chainSum(p []byte) [sha256.Size]byte {
	if j.chain == nil {
		j.chain = sha256.New()
	}
	j.chain.Reset()
	j.chain.Write(j.prev[:])
	j.chain.Write(p)
	var out [sha256.Size]byte
	j.chain.Sum(out[:0])
	return out
}

// splitSum splits a record's line (without its newline) into the bytes its
// checksum covers and the checksum; ok is false when it has no checksum
// member at its end (a record written before checksums, or a damaged one).
func splitSum(line []byte) (p []byte, sum [sha256.Size]byte, ok bool) {
	n := len(line) - sumSuffixLen
	if n < 1 || !bytes.HasPrefix(line[n:], []byte(sumMember)) || !bytes.HasSuffix(line, []byte(`"}`)) {
		return nil, sum, false
	}
	if _, err := hex.Decode(sum[:], line[n+len(sumMember):len(line)-2]); err != nil {
		return nil, sum, false
	}
	return line[:n], sum, true
}

// Close appends a "close" record, flushes and syncs the journal.
func (j *Journal) Close() error {
	j.syncMu.Lock()
	defer j.syncMu.Unlock()
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.err
	if werr := j.write(JournalRecord{Op: "close"}); err == nil {
		err = werr
	}
	if ferr := j.w.Flush(); err == nil {
		err = ferr
	}
	if serr := syncFile(j.f); err == nil {
		err = serr
	}
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	if err == nil && j.whole && !j.failed {
		remember(j.path, writtenSum{
			sum:   FileSum{Bytes: j.bytes, SHA256: hex.EncodeToString(j.hash.Sum(nil)), Records: j.records},
			needs: needsKeys(j.values.counts()), needsKnown: true,
		})
	}
	return err
}

// ReadJournal calls fn with each record of the journal at path, oldest first,
// reading one line at a time (a line is as long as its value needs). A line
// that is not a record is an error naming the file and the line; a last line
// cut short by a crash is too: rollback, which reads journals backwards,
// is the reader that forgives it.
func ReadJournal(path string, fn func(JournalRecord) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	r := bufio.NewReader(f)
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if len(b) > 0 {
			var rec JournalRecord
			if jerr := json.Unmarshal(b, &rec); jerr != nil {
				return fmt.Errorf("journal %s line %d: %w", path, line, jerr)
			}
			if ferr := fn(rec); ferr != nil {
				return ferr
			}
		}
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("journal %s: %w", path, err)
		}
	}
}

// JournalsPrefix is the etcd prefix the run of the first of the journals
// whose begin record names one worked on ("/registry" when none does).
func JournalsPrefix(journals []string) string {
	for _, p := range journals {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var r JournalRecord
		err = json.NewDecoder(bufio.NewReader(f)).Decode(&r)
		f.Close()
		if err == nil && r.Op == "begin" && r.Prefix != "" {
			return r.Prefix
		}
	}
	return "/registry"
}

// JournalRecordBytes is about what the journal records of one rewrite take:
// the old value's base64, the key twice, and the rest of the intent and done
// records (fields, sequence numbers, the new value's hash, two checksums).
func JournalRecordBytes(key string, oldSize int) int64 {
	return int64(base64.StdEncoding.EncodedLen(oldSize)) + 2*int64(len(key)) + 448
}

// JournalCost is what journaling the rewrite of puts (old: their stored
// values) costs the journal's own code, without its file: the time to
// encode their records as a run writes them (an intent and a done record
// each, numbered and chained, the file's checksum and the old values' keys
// counted as they are appended), the time to read them back as a journal
// is checked (each line hashed, parsed and its chain checked: a rollback's
// check before its first write; a run's end reads its journal only when it
// changed since it was written), and the bytes they take. plan times a sample of the cluster's
// own objects with it.
func JournalCost(puts []etcdscan.Put, old [][]byte) (write, read time.Duration, size int64) {
	var out bytes.Buffer
	j := &Journal{w: bufio.NewWriter(&out), hash: sha256.New(), values: newValueCheck(CheckOptions{})}
	j.enc = json.NewEncoder(&j.buf)
	start := time.Now()
	for i, p := range puts {
		sum := sha256.Sum256(p.Value)
		_ = j.write(JournalRecord{Op: "intent", Key: p.Key, OldModRevision: p.ModRevision, OldValue: old[i], NewSHA256: hex.EncodeToString(sum[:])})
		_ = j.write(JournalRecord{Op: "done", Key: p.Key, NewModRevision: p.ModRevision + 1})
	}
	_ = j.w.Flush()
	write = time.Since(start)
	start = time.Now()
	h := sha256.New()
	var prev [sha256.Size]byte
	for line := range bytes.Lines(out.Bytes()) {
		h.Write(line)
		var r checkRecord
		body := bytes.TrimSuffix(line, []byte("\n"))
		_ = parseRecord(body, &r)
		if p, sum, ok := splitSum(body); ok && chainSum(prev, p) == sum {
			prev = sum
		}
	}
	h.Sum(nil)
	return write, time.Since(start), int64(out.Len())
}

// UndoWrites adds up what undoing every record of the journals writes, each
// put's cost as cost gives it for its key's and value's lengths: each
// overwrite's and re-creation's old value (its length from the base64, not
// decoded), each removal's deletion (no value). A record that does not parse
// ends the count of its journal: a torn last record undoes nothing, and a
// rollback refuses a damaged earlier one (CheckJournal).
func UndoWrites(journals []string, cost func(keyLen, valueLen int) int64) (int64, error) {
	var n int64
	for _, path := range journals {
		f, err := os.Open(path)
		if err != nil {
			return 0, fmt.Errorf("journal %s: %w", path, err)
		}
		dec := json.NewDecoder(f)
		for {
			var r struct {
				Op       string          `json:"op"`
				Key      string          `json:"key"`
				OldValue json.RawMessage `json:"oldValue"`
			}
			if dec.Decode(&r) != nil {
				break
			}
			switch r.Op {
			case "intent", "delete-intent":
				n += cost(len(r.Key), base64.StdEncoding.DecodedLen(max(len(r.OldValue)-2, 0)))
			case "create-intent":
				n += cost(len(r.Key), 0)
			}
		}
		f.Close()
	}
	return n, nil
}
