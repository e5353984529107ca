package undo

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
)

// JournalRecord is one line of a journal (JSON lines). An "intent" record is
// written and synced before the write is sent; a "done" record after it landed.
// A delete (quarantine) is journaled the same way as "delete-intent", with the
// key's lease and revisions, and "deleted". OldValue holds the stored bytes
// exactly as they were, still encrypted if they were: a journal of
// identity-stored secrets holds those secrets, hence mode 0600. Readers ignore
// fields and ops they do not know.
type JournalRecord struct {
	Op             string `json:"op"` // "begin", "intent", "done", "delete-intent", "deleted"
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
}

// Journal appends records to a file, syncing each batch of intents before the
// batch is written.
type Journal struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	enc *json.Encoder
}

// OpenJournal creates (or appends to) a journal file with mode 0600.
func OpenJournal(path string) (*Journal, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, input.Errorf("%s %s: %w", input.Journal, path, err)
	}
	if fi, err := f.Stat(); err == nil && fi.Mode().Perm()&0o077 != 0 {
		f.Close()
		return nil, input.Errorf("%s %s: file is readable by others (mode %v); it will hold stored values, use a file with mode 0600", input.Journal, path, fi.Mode().Perm())
	}
	w := bufio.NewWriterSize(f, 1<<20)
	return &Journal{f: f, w: w, enc: json.NewEncoder(w)}, nil
}

// Begin records the start of a run.
func (j *Journal) Begin(revision int64, prefix string) error {
	return j.append(true, JournalRecord{Op: "begin", Revision: revision, Prefix: prefix})
}

// BeginCommand records the start of a run of another command than migrate.
func (j *Journal) BeginCommand(command string, revision int64, prefix string) error {
	return j.append(true, JournalRecord{Op: "begin", Command: command, Revision: revision, Prefix: prefix})
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

func (j *Journal) append(sync bool, recs ...JournalRecord) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, r := range recs {
		if err := j.enc.Encode(r); err != nil {
			return fmt.Errorf("journal: %w", err)
		}
	}
	if !sync {
		return nil
	}
	if err := j.w.Flush(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if err := j.f.Sync(); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

// Close flushes and syncs the journal.
func (j *Journal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	err := j.w.Flush()
	if serr := j.f.Sync(); err == nil {
		err = serr
	}
	if cerr := j.f.Close(); err == nil {
		err = cerr
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

// JournalRecordBytes is about what the journal records of one rewrite take.
func JournalRecordBytes(key string, oldSize int) int64 {
	return int64(base64.StdEncoding.EncodedLen(oldSize)) + 2*int64(len(key)) + 256
}
