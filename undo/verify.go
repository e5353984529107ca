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
	"io"
	"os"
	"sort"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/textfmt"
)

// FileSum is what a run records, when it ends, of a file of its undo: its
// size and sha256 (as sha256sum prints it), and for a journal its records.
type FileSum struct {
	Bytes   int64  `json:"bytes"`
	SHA256  string `json:"sha256"`
	Records int64  `json:"records,omitempty"`
}

// How a journal's records verify (JournalCheck.Status).
const (
	// JournalVerified: every record's checksum matches and chains to the
	// previous one, and the file matches what its run recorded at its end
	// (when it recorded one).
	JournalVerified = "verified"
	// JournalUnverifiable: records without checksums (a journal written
	// before records were checksummed): read whole and parsed, nothing more
	// can be known.
	JournalUnverifiable = "unverifiable"
)

// JournalSpec is a journal to check and what is known of the run that wrote
// it.
type JournalSpec struct {
	Path string
	// Record is the run that wrote it; nil when none is known (a journal
	// given by its path that no run of the state directory records). A run
	// that recorded its end (Finished) must match the checksum it recorded
	// then, and its journal may not end with a record cut short.
	Record *Record
}

// CheckOptions are what CheckJournal checks the old values against.
type CheckOptions struct {
	// Encryption, when set, is the encryption configuration kube-apiserver
	// will read the values with: each old value a rollback would put back is
	// decrypted with it (kube-apiserver's own transformers; the plaintext is
	// dropped at once), except KMS v1 values, of which the first under each
	// provider and resource is decrypted and the rest checked by their
	// envelope (each would be a call to the plugin). nil: the values are
	// counted by their envelope (provider and key) alone.
	Encryption *encryption.Transformers
	// Prefix is etcd's prefix, for a journal whose begin record names none
	// ("" is /registry).
	Prefix string
}

// What a value of a journal is, as far as putting it back goes (ValueCount.State).
const (
	// ValueReadable: the configuration decrypts it.
	ValueReadable = "readable"
	// ValueUnreadable: the configuration cannot decrypt it.
	ValueUnreadable = "unreadable"
	// ValueUnchecked: no configuration to check it against.
	ValueUnchecked = "unchecked"
	// ValueQuarantined: a value quarantine removed (unreadable, or not an
	// object, then): put back as it was, readable or not.
	ValueQuarantined = "quarantined"
	// ValueNotRead: a key no kube-apiserver reads (not an object of any
	// resource).
	ValueNotRead = "not-read"
)

// ValueCount counts the old values under one provider and key
// ("aescbc:key1", "identity") in one state.
type ValueCount struct {
	Encryption string `json:"encryption"`
	State      string `json:"state"`
	Values     int64  `json:"values"`
	// FirstKey is the first value's key, and Detail why it is unreadable
	// (provider and key names, never plaintext).
	FirstKey string `json:"firstKey"`
	Detail   string `json:"detail,omitempty"`
}

// JournalCheck is a journal read whole.
type JournalCheck struct {
	Path string `json:"path"`
	// Run is the ID of the run that wrote it, when known.
	Run    string `json:"run,omitempty"`
	Status string `json:"status"`
	// Records counts the records read; Unchecked those without a checksum.
	Records   int64 `json:"records"`
	Unchecked int64 `json:"unchecked,omitempty"`
	// Bytes and SHA256 are the file's, as read.
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Sealed: the run recorded its end, and the file is what it recorded then.
	Sealed bool `json:"sealed,omitempty"`
	// Appended counts the bytes after what its run recorded at its end
	// (another run given the same journal file).
	Appended int64 `json:"appended,omitempty"`
	// Closed: its last record is the close record of a writer that ended.
	Closed bool `json:"closed"`
	// RunEnded: its run recorded its end.
	RunEnded bool `json:"runEnded,omitempty"`
	// TornTail: its last record was cut short (its writer was killed while
	// appending it, before the write it announced was sent): passed over.
	TornTail bool `json:"tornTail,omitempty"`
	// Values counts the old values a rollback would put back, by provider
	// and key and state.
	Values []ValueCount `json:"values,omitempty"`
	// validBytes is where its records end (a torn tail excluded).
	validBytes int64
}

// ValidBytes is where the journal's records end (a torn tail excluded): what
// a rollback reads of it.
func (c JournalCheck) ValidBytes() int64 { return c.validBytes }

// NeedsKeys are the providers and keys of the values a rollback puts back
// (values a quarantine removed, and keys no kube-apiserver reads, apart),
// e.g. ["aescbc:key1", "identity"].
func (j *JournalCheck) NeedsKeys() []string { return needsKeys(j.Values) }

func needsKeys(counts []ValueCount) []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range counts {
		if c.State == ValueQuarantined || c.State == ValueNotRead || seen[c.Encryption] {
			continue
		}
		seen[c.Encryption] = true
		out = append(out, c.Encryption)
	}
	sort.Strings(out)
	return out
}

// Line says in one line how the journal verified.
func (j *JournalCheck) Line() string {
	who := "journal " + j.Path
	if j.Run != "" {
		who += " (run " + j.Run + ")"
	}
	var s string
	switch j.Status {
	case JournalUnverifiable:
		s = fmt.Sprintf("%s: UNVERIFIED: %s record(s) without checksums (written before journal records were checksummed), read whole: each parses, nothing more can be known", who, fmt.Sprint(j.Unchecked))
		if j.Records > j.Unchecked {
			s += fmt.Sprintf("; %s later record(s) verified", fmt.Sprint(j.Records-j.Unchecked))
		}
	default:
		s = fmt.Sprintf("%s: verified: %s record(s), each checksum matching and chained to the one before", who, fmt.Sprint(j.Records))
	}
	switch {
	case j.Sealed:
		s += fmt.Sprintf("; %s bytes matching the sha256 recorded at the run's end", fmt.Sprint(j.Bytes-j.Appended))
		if j.Appended > 0 {
			s += fmt.Sprintf(" (and %s bytes a later run appended)", fmt.Sprint(j.Appended))
		}
	case j.RunEnded:
		s += "; its run recorded no checksum at its end (a release before checksums)"
	case j.Run != "":
		s += "; its run recorded no end (killed, or still running): nothing to compare its length with"
	case j.Closed:
		s += "; it ends with its writer's close record"
	default:
		s += "; no run records it and it does not end with a close record (its writer was killed, or the file was cut at a record boundary: nothing after its last record can be known)"
	}
	if j.TornTail {
		s += "; its last record, cut short when its writer was killed, was passed over (the write it announced was never sent)"
	}
	return s
}

// JournalDamageError is a journal that does not verify: a record altered,
// out of order, missing or cut short, or a file that is not what its run
// recorded at its end.
type JournalDamageError struct {
	Path string
	// Line is the line of the first bad record (0: the file as a whole),
	// Offset its byte offset, Key its key as read ("" when it does not read)
	// and After the key of the last good record before it.
	Line   int64
	Offset int64
	Key    string
	After  string
	Why    string
	// WayBack says what restores the state the undo was for (a run's
	// snapshot, and whether it verifies); set by CheckUndo.
	WayBack string
}

func (e *JournalDamageError) Error() string {
	s := "journal " + e.Path + " is damaged"
	if e.Line > 0 {
		s += fmt.Sprintf(": record at line %d (byte %d)", e.Line, e.Offset)
		switch {
		case e.Key != "":
			s += " for key " + e.Key
		case e.After != "":
			s += ", after the record of " + e.After
		}
	}
	s += ": " + e.Why
	if e.WayBack != "" {
		// Refused by a rollback (CheckUndo).
		s += "; nothing was written; " + e.WayBack
	}
	return s
}

// checkRecord is what checking reads of a record: the old value is decoded
// from its base64 only when it is needed.
type checkRecord struct {
	Seq      int64           `json:"seq"`
	Op       string          `json:"op"`
	Key      string          `json:"key"`
	Prefix   string          `json:"prefix"`
	OldValue json.RawMessage `json:"oldValue"`
	Reason   string          `json:"reason"`
}

// CheckJournal reads the journal at spec.Path whole, one record at a time
// (memory: one record, whatever the journal's size), and says whether it
// verifies (see "Journal format" in the package doc) and what its old values
// need to be read (opts). A journal that does not verify is a
// *JournalDamageError naming the first bad record; one without checksums
// (written before them) is JournalUnverifiable, not an error.
func CheckJournal(ctx context.Context, spec JournalSpec, opts CheckOptions) (*JournalCheck, error) {
	f, err := os.Open(spec.Path)
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", spec.Path, err)
	}
	defer f.Close()
	jc := &JournalCheck{Path: spec.Path, Status: JournalVerified}
	var seal *FileSum
	finished := false
	if spec.Record != nil {
		jc.Run = spec.Record.ID
		finished = spec.Record.Finished()
		seal = spec.Record.JournalSum
		jc.RunEnded = finished
	}
	vc := newValueCheck(opts)
	h := sha256.New()
	br := bufio.NewReaderSize(f, 1<<20)
	var (
		prev    [sha256.Size]byte
		seq     int64
		chained bool
		off     int64
		lastKey string
		lastOp  string
		buf     []byte
		valBuf  []byte
		sealSum string
	)
	for n := int64(1); ; n++ {
		if n%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		line, rerr := readLine(br, &buf)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return nil, fmt.Errorf("journal %s: %w", spec.Path, rerr)
		}
		if len(line) == 0 {
			break
		}
		h.Write(line)
		complete := line[len(line)-1] == '\n'
		body := line
		if complete {
			body = line[:len(line)-1]
		}
		damage := func(key, why string) *JournalDamageError {
			return &JournalDamageError{Path: spec.Path, Line: n, Offset: off, Key: key, After: lastKey, Why: why}
		}
		var r checkRecord
		perr := parseRecord(body, &r)
		why := ""
		p, sum, hasSum := splitSum(body)
		switch {
		case perr != nil:
			why = "not a journal record (" + textfmt.OneLine(perr.Error()) + ")"
		case hasSum && r.Seq != seq+1:
			why = fmt.Sprintf("record %d where record %d was expected: records reordered, removed or repeated", r.Seq, seq+1)
		case hasSum && chainSum(prev, p) != sum:
			why = "its checksum does not match its bytes: altered (a flipped bit, a value or key from another record)"
		case !hasSum && chained:
			why = "no checksum, after records that have one: altered"
		case r.Op == "":
			why = "no op: not a journal record"
		}
		var val []byte
		if why == "" && len(r.OldValue) > 0 && string(r.OldValue) != "null" {
			if val, err = decodeBytes(r.OldValue, &valBuf); err != nil {
				why = "its old value is not base64 (" + textfmt.OneLine(err.Error()) + ")"
			}
		}
		if why != "" {
			if !complete {
				if !finished || (seal != nil && off >= seal.Bytes) {
					// Cut short while its writer was killed: the write it
					// announced was never sent (each batch's records are
					// synced before it is).
					jc.TornTail = true
					off += int64(len(line))
					break
				}
				why = "the journal ends with a record cut short, but its run recorded its end: the file was cut"
			}
			return nil, damage(r.Key, why)
		}
		if hasSum {
			prev, seq, chained = sum, r.Seq, true
		} else {
			jc.Unchecked++
		}
		jc.Records++
		if r.Op == "begin" && r.Prefix != "" {
			vc.prefix = r.Prefix
		}
		if err := vc.add(ctx, &r, val); err != nil {
			return nil, fmt.Errorf("journal %s: %w", spec.Path, err)
		}
		if r.Key != "" {
			lastKey = r.Key
		}
		lastOp = r.Op
		off += int64(len(line))
		jc.validBytes = off
		if seal != nil && off == seal.Bytes {
			sealSum = hex.EncodeToString(h.Sum(nil))
		}
		if !complete {
			break
		}
	}
	jc.Bytes, jc.SHA256 = off, hex.EncodeToString(h.Sum(nil))
	jc.Closed = lastOp == "close"
	jc.Values = vc.counts()
	if jc.Unchecked > 0 {
		jc.Status = JournalUnverifiable
	}
	if finished && seal != nil {
		switch {
		case off < seal.Bytes:
			return nil, &JournalDamageError{Path: spec.Path, Line: jc.Records + 1, Offset: off, After: lastKey,
				Why: fmt.Sprintf("cut short: the file ends at byte %d after record %d, its run recorded %d bytes and %d record(s) at its end", off, jc.Records, seal.Bytes, seal.Records)}
		case sealSum != seal.SHA256:
			return nil, &JournalDamageError{Path: spec.Path,
				Why: fmt.Sprintf("its first %d bytes are not what its run recorded at its end (sha256 %s, recorded %s)", seal.Bytes, sealSum, seal.SHA256)}
		}
		jc.Sealed, jc.Appended = true, off-seal.Bytes
	}
	return jc, nil
}

// oldValueMember starts a record's old value. Inside a JSON string a quote
// is escaped, so its first occurrence in a record is the member itself.
const oldValueMember = `,"oldValue":"`

// parseRecord parses a record's line into r. The old value, most of a
// record's bytes, is cut out and kept raw (base64 has no quote), so that the
// JSON parser reads only the rest; a line where that does not hold is parsed
// whole.
func parseRecord(body []byte, r *checkRecord) error {
	i := bytes.Index(body, []byte(oldValueMember))
	if i < 0 {
		return json.Unmarshal(body, r)
	}
	start := i + len(oldValueMember)
	n := bytes.IndexByte(body[start:], '"')
	if n < 0 || bytes.IndexByte(body[start:start+n], '\\') >= 0 {
		return json.Unmarshal(body, r)
	}
	rest := make([]byte, 0, len(body)-n)
	rest = append(append(rest, body[:i]...), body[start+n+1:]...)
	if err := json.Unmarshal(rest, r); err != nil {
		return err
	}
	r.OldValue = body[start-1 : start+n+1]
	return nil
}

// readLine reads the next line with its newline (a last line may have none),
// in *buf when it does not fit the reader's buffer; valid until the next call.
func readLine(br *bufio.Reader, buf *[]byte) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if !errors.Is(err, bufio.ErrBufferFull) {
		return line, err
	}
	*buf = append((*buf)[:0], line...)
	for errors.Is(err, bufio.ErrBufferFull) {
		line, err = br.ReadSlice('\n')
		*buf = append(*buf, line...)
	}
	return *buf, err
}

// decodeBytes decodes a JSON string of base64, as encoding/json encodes a
// []byte (which never escapes a base64 character), into *buf (valid until
// the next call); a string with escapes goes through encoding/json.
func decodeBytes(raw json.RawMessage, buf *[]byte) ([]byte, error) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		s := raw[1 : len(raw)-1]
		if n := base64.StdEncoding.DecodedLen(len(s)); cap(*buf) < n {
			*buf = make([]byte, n)
		}
		out := (*buf)[:cap(*buf)]
		if n, err := base64.StdEncoding.Decode(out, s); err == nil {
			return out[:n], nil
		}
	}
	var out []byte
	err := json.Unmarshal(raw, &out)
	return out, err
}
