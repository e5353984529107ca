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
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/snapshotdb"
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

// valueCheck counts the old values of a journal by provider, key and state,
// decrypting them with the configuration when there is one.
type valueCheck struct {
	enc      *encryption.Transformers
	prefix   string
	resolver *decode.Resolver
	noRes    bool // the resolver could not be built: every key is guessed
	sampled  map[string]bool
	byKey    map[[2]string]*ValueCount
	order    [][2]string
	// plugins: the KMS plugins asked whether they work, by resource and
	// provider:name (nil: it works).
	plugins map[string]*encryption.KMSPluginError
}

func newValueCheck(opts CheckOptions) *valueCheck {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = "/registry"
	}
	return &valueCheck{enc: opts.Encryption, prefix: prefix, sampled: map[string]bool{}, byKey: map[[2]string]*ValueCount{}}
}

func (v *valueCheck) count(enc, state, key, detail string) {
	k := [2]string{enc, state}
	c := v.byKey[k]
	if c == nil {
		c = &ValueCount{Encryption: enc, State: state, FirstKey: key, Detail: detail}
		v.byKey[k] = c
		v.order = append(v.order, k)
	}
	c.Values++
}

// counts are the counts, unreadable first, then by provider:key.
func (v *valueCheck) counts() []ValueCount {
	out := make([]ValueCount, 0, len(v.order))
	for _, k := range v.order {
		out = append(out, *v.byKey[k])
	}
	rank := map[string]int{ValueUnreadable: 0, ValueUnchecked: 1, ValueReadable: 2, ValueQuarantined: 3, ValueNotRead: 4}
	sort.SliceStable(out, func(i, j int) bool {
		if a, b := rank[out[i].State], rank[out[j].State]; a != b {
			return a < b
		}
		return out[i].Encryption < out[j].Encryption
	})
	return out
}

// add counts the value a rollback of record r would put back (none for
// records that put back no value).
func (v *valueCheck) add(ctx context.Context, r *checkRecord, val []byte) error {
	switch r.Op {
	case "intent":
	case "delete-intent":
		if r.Reason != "" && r.Reason != "rollback" {
			// quarantine removed it as unreadable (or not an object): put back as it was.
			v.count(encryption.EnvelopeInfo(val).String(), ValueQuarantined, r.Key, "")
			return nil
		}
	default:
		return nil
	}
	info := encryption.EnvelopeInfo(val)
	name := info.String()
	if v.enc == nil {
		v.count(name, ValueUnchecked, r.Key, "")
		return nil
	}
	gr, ok := v.resource(r.Key)
	if !ok {
		v.count(name, ValueNotRead, r.Key, "")
		return nil
	}
	if info.Provider == encryption.ProviderKMSv1 {
		// Each KMS v1 value is a call to its plugin: the first of each
		// provider and resource is decrypted, the rest checked by envelope.
		s := gr.String() + " " + name
		if v.sampled[s] {
			if v.enc.CanRead(gr, info) {
				v.count(name, ValueReadable, r.Key, "")
			} else {
				v.count(name, ValueUnreadable, r.Key, fmt.Sprintf("stored as %s, which the configuration for %s does not have", name, gr))
			}
			return nil
		}
		v.sampled[s] = true
	}
	_, _, err := v.enc.Decrypt(ctx, gr, r.Key, val)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		detail := err.Error()
		var de *encryption.DecryptError
		if errors.As(err, &de) {
			if de.Plugin != nil {
				// No answer: every value under a data key not yet
				// decrypted would wait out the plugin's timeout.
				return &PluginStopError{Key: r.Key, Plugin: de.Plugin}
			}
			detail = de.Detail
		}
		if p := v.pluginDown(ctx, gr, info); p != nil {
			return &PluginStopError{Key: r.Key, Plugin: p}
		}
		v.count(name, ValueUnreadable, r.Key, detail)
		return nil
	}
	v.count(name, ValueReadable, r.Key, "")
	return nil
}

// pluginDown is the KMS plugin of info, a value's envelope, when it does
// not work (asked once per plugin: Transformers.CheckKMSPlugins): a value
// it could not decrypt is then no value's fault (its plugin was down when
// the tool started, or answers unhealthy). nil for any other provider, or a
// plugin that works (the value itself is refused).
func (v *valueCheck) pluginDown(ctx context.Context, gr schema.GroupResource, info encryption.Info) *encryption.KMSPluginError {
	if info.Provider != encryption.ProviderKMSv1 && info.Provider != encryption.ProviderKMSv2 {
		return nil
	}
	id := gr.String() + " " + info.String()
	if p, asked := v.plugins[id]; asked {
		return p
	}
	if v.plugins == nil {
		v.plugins = map[string]*encryption.KMSPluginError{}
	}
	var down *encryption.KMSPluginError
	for _, p := range v.enc.CheckKMSPlugins(ctx, []schema.GroupResource{gr}) {
		if p.Provider == info.Provider && p.Name == info.KeyName {
			down = p
		}
	}
	v.plugins[id] = down
	return down
}

// PluginStopError stops the check of the values a journal would put back
// (a rollback's, before its first write; verify's of a state directory): a
// KMS plugin that does not answer, or does not work, could not decrypt Key's.
// No value's fault: nothing is counted unreadable, nothing was written.
type PluginStopError struct {
	Key    string
	Plugin *encryption.KMSPluginError
}

func (e *PluginStopError) Error() string {
	return fmt.Sprintf("%s: %v; the values a rollback puts back are each decrypted with the cluster's configuration before its first write, and that needs the plugin", e.Key, e.Plugin)
}

func (e *PluginStopError) Unwrap() error { return e.Plugin }

// resource is the group/resource kube-apiserver reads key as (a custom
// resource's by its key: no CRD is known here); false for a key no
// kube-apiserver reads as an object.
func (v *valueCheck) resource(key string) (schema.GroupResource, bool) {
	if v.resolver == nil && !v.noRes {
		storage, err := decode.NewStorageConfig("")
		if err != nil {
			v.noRes = true
		} else {
			v.resolver = decode.NewResolver(v.prefix, storage)
		}
	}
	if v.resolver == nil || !strings.HasPrefix(key, strings.TrimSuffix(v.prefix, "/")+"/") {
		if !strings.HasPrefix(key, strings.TrimSuffix(v.prefix, "/")+"/") {
			return schema.GroupResource{}, false
		}
		return decode.GuessResource(v.prefix, key), true
	}
	info, err := v.resolver.Resolve(key)
	if err == nil {
		return info.Resource, true
	}
	var de *decode.Error
	if errors.As(err, &de) && de.Reason == decode.ReasonOrphaned && de.Orphan == decode.OrphanCRDMissing {
		return decode.GuessResource(v.prefix, key), true
	}
	return schema.GroupResource{}, false
}

// SnapshotCheck is a run's snapshot file read whole.
type SnapshotCheck struct {
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Trailer: etcd's sha256 trailer matches the database.
	Trailer bool `json:"trailer"`
	// Sealed: the file is what its run recorded at its end.
	Sealed bool `json:"sealed,omitempty"`
	// Problem says why it does not verify ("" when it does).
	Problem string `json:"problem,omitempty"`
}

// CheckSnapshot reads a run's snapshot whole: etcd's own sha256 trailer, and
// the checksum the run recorded at its end (want; nil when it recorded none).
func CheckSnapshot(path string, want *FileSum) (*SnapshotCheck, error) {
	d, err := snapshotdb.Digest(path)
	if err != nil {
		return nil, err
	}
	sc := &SnapshotCheck{Path: path, Bytes: d.Size, SHA256: d.SHA256, Trailer: d.Trailer}
	switch {
	case want != nil && (want.Bytes != d.Size || want.SHA256 != d.SHA256):
		sc.Problem = fmt.Sprintf("not what its run recorded at its end (%d bytes, sha256 %s; now %d bytes, %s)", want.Bytes, want.SHA256, d.Size, d.SHA256)
	case !d.HasTrailer:
		sc.Problem = "no etcd sha256 trailer: truncated, or not a snapshot etcd saved"
	case !d.Trailer:
		sc.Problem = "its database does not match etcd's sha256 trailer: corrupt"
	default:
		sc.Sealed = want != nil
	}
	return sc, nil
}

// Line says in one line how the snapshot verified.
func (s *SnapshotCheck) Line() string {
	switch {
	case s.Problem != "":
		return fmt.Sprintf("snapshot %s is DAMAGED: %s", s.Path, s.Problem)
	case s.Sealed:
		return fmt.Sprintf("snapshot %s verified (sha256 %s, as recorded at its run's end; etcd's trailer matches)", s.Path, s.SHA256)
	}
	return fmt.Sprintf("snapshot %s: etcd's sha256 trailer matches (its run recorded no checksum: it did not record its end); sha256 %s", s.Path, s.SHA256)
}

// WayBack says which run's snapshot restores the state before rec, and
// whether it verifies (read whole).
func WayBack(rec *Record) string {
	if rec == nil {
		return "no run of the state directory records this journal: its run's snapshot, if kept, is the way back (etcdutl snapshot restore)"
	}
	if !rec.SnapshotTaken() {
		return fmt.Sprintf("run %s kept no snapshot (%s): restore the last backup from before it", rec.ID, rec.Snapshot)
	}
	sc, err := CheckSnapshot(rec.Snapshot, rec.SnapshotSum)
	if err != nil {
		return fmt.Sprintf("run %s's snapshot %s is the way back to the state before it, but it does not read: %v", rec.ID, rec.Snapshot, err)
	}
	if sc.Problem != "" {
		return fmt.Sprintf("run %s's snapshot %s would be the way back to the state before it, but it is damaged too: %s", rec.ID, rec.Snapshot, sc.Problem)
	}
	how := "etcd's sha256 trailer matches; its run recorded no checksum"
	if sc.Sealed {
		how = "sha256 " + sc.SHA256 + " matches the checksum recorded at its run's end"
	}
	return fmt.Sprintf("run %s's snapshot %s is the way back to the state before it (%s): etcdutl snapshot restore, every kube-apiserver stopped", rec.ID, rec.Snapshot, how)
}

// UndoCheck is every journal a rollback undoes, read whole before its first
// write, and what their old values need.
type UndoCheck struct {
	Journals []*JournalCheck `json:"journals"`
	// EncryptionConfig is the configuration the values were decrypted with
	// ("" when none was given: Configured false).
	EncryptionConfig string `json:"encryptionConfig,omitempty"`
	Configured       bool   `json:"configured"`
	// Values adds up the journals' values by provider, key and state.
	Values []ValueCount `json:"values,omitempty"`
}

// UndoOptions are CheckUndo's.
type UndoOptions struct {
	CheckOptions
	// Configured says that the cluster's encryption configuration was given
	// (Encryption is then set; Encryption.Path "" is identity everywhere,
	// kube-apiserver without --encryption-provider-config).
	Configured bool
	// WayBack is the run whose snapshot is the state the rollback returns
	// to (the oldest run undone), named when a journal is damaged.
	WayBack *Record
}

// CheckUndo reads every journal whole (CheckJournal) before a rollback
// writes anything. A damaged journal is a *JournalDamageError whose WayBack
// says which snapshot restores the state the rollback was for, and whether
// it verifies.
func CheckUndo(ctx context.Context, journals []JournalSpec, opts UndoOptions) (*UndoCheck, error) {
	u := &UndoCheck{Configured: opts.Configured}
	if opts.Configured && opts.Encryption != nil {
		u.EncryptionConfig = opts.Encryption.Path
	} else {
		opts.Encryption = nil
	}
	all := map[[2]string]*ValueCount{}
	var order [][2]string
	for _, spec := range journals {
		jc, err := CheckJournal(ctx, spec, opts.CheckOptions)
		var de *JournalDamageError
		if errors.As(err, &de) {
			way := opts.WayBack
			if way == nil {
				way = spec.Record
			}
			de.WayBack = WayBack(way)
			return nil, de
		}
		if err != nil {
			return nil, err
		}
		u.Journals = append(u.Journals, jc)
		for _, c := range jc.Values {
			k := [2]string{c.Encryption, c.State}
			if a := all[k]; a != nil {
				a.Values += c.Values
				continue
			}
			cc := c
			all[k] = &cc
			order = append(order, k)
		}
	}
	for _, k := range order {
		u.Values = append(u.Values, *all[k])
	}
	return u, nil
}

// Unverified are the journals without checksums (JournalUnverifiable).
func (u *UndoCheck) Unverified() []string {
	var out []string
	for _, j := range u.Journals {
		if j.Status == JournalUnverifiable {
			out = append(out, j.Path)
		}
	}
	return out
}

// Lines are the check's lines for a rollback's preflight.
func (u *UndoCheck) Lines() []string {
	var out []string
	for _, j := range u.Journals {
		out = append(out, j.Line())
	}
	return append(out, u.EncryptionLine())
}

// EncryptionLine says what the values put back need and whether the
// configuration reads them.
func (u *UndoCheck) EncryptionLine() string {
	var put []string
	var total int64
	for _, c := range u.Values {
		if c.State == ValueQuarantined || c.State == ValueNotRead {
			continue
		}
		put = append(put, fmt.Sprintf("%s=%s (%s)", c.Encryption, fmt.Sprint(c.Values), c.State))
		total += c.Values
	}
	var s string
	switch {
	case total == 0:
		s = "encryption: no value to put back"
	case !u.Configured:
		s = fmt.Sprintf("encryption: NOT CHECKED: no encryption configuration given; the %s value(s) put back are %s", fmt.Sprint(total), strings.Join(put, ", "))
	default:
		cfg := u.EncryptionConfig
		if cfg == "" {
			cfg = "none (identity for every resource)"
		}
		s = fmt.Sprintf("encryption: the %s value(s) put back, decrypted with the configuration %s: %s", fmt.Sprint(total), cfg, strings.Join(put, ", "))
	}
	for _, c := range u.Values {
		switch c.State {
		case ValueQuarantined:
			s += fmt.Sprintf("; %s value(s) under %s that quarantine removed are put back as they were, readable or not", fmt.Sprint(c.Values), c.Encryption)
		case ValueNotRead:
			s += fmt.Sprintf("; %s value(s) under %s of keys no kube-apiserver reads", fmt.Sprint(c.Values), c.Encryption)
		}
	}
	return s
}

// UnverifiedJournalError refuses journals without checksums unless the
// operator accepts them (input.AllowUnverifiedJournal).
type UnverifiedJournalError struct{ Journals []string }

func (e *UnverifiedJournalError) Error() string { return e.Render(input.Words) }

// Render is the message with the operator's inputs spelled by spell.
func (e *UnverifiedJournalError) Render(spell func(input.Name) string) string {
	return fmt.Sprintf("journal %s has no checksums (written before journal records were checksummed): a damaged record cannot be told from a good one; nothing was written. Check it ('kube-etcd-migrate runs --verify' reads it whole), then roll back with %s to put its values back unverified, or restore its run's snapshot",
		strings.Join(e.Journals, ", "), spell(input.AllowUnverifiedJournal))
}

// UnreadableValuesError refuses a rollback that would put back values the
// cluster's encryption configuration cannot decrypt.
type UnreadableValuesError struct {
	Config string
	Counts []ValueCount // ValueUnreadable only
}

func (e *UnreadableValuesError) Error() string { return e.Render(input.Words) }

// Render is the message with the operator's inputs spelled by spell.
func (e *UnreadableValuesError) Render(spell func(input.Name) string) string {
	var total int64
	var parts []string
	for _, c := range e.Counts {
		total += c.Values
		parts = append(parts, fmt.Sprintf("%s under %s (the first %s: %s)", fmt.Sprint(c.Values), c.Encryption, c.FirstKey, c.Detail))
	}
	cfg := e.Config
	if cfg == "" {
		cfg = "(none: identity for every resource)"
	}
	return fmt.Sprintf("rollback would put back %s value(s) that the encryption configuration %s cannot decrypt: %s; kube-apiserver could not read them. Put each provider and key named back in the configuration kube-apiserver will run with (after the one new writes use), give it with %s or %s, and roll back again; nothing was written",
		fmt.Sprint(total), cfg, strings.Join(parts, "; "), spell(input.APIServerManifest), spell(input.EncryptionProviderConfig))
}

// NoEncryptionConfigError refuses a rollback that would put back encrypted
// values with no encryption configuration to check them against.
type NoEncryptionConfigError struct {
	Counts []ValueCount // the encrypted values, by provider and key
}

func (e *NoEncryptionConfigError) Error() string { return e.Render(input.Words) }

// Render is the message with the operator's inputs spelled by spell.
func (e *NoEncryptionConfigError) Render(spell func(input.Name) string) string {
	var total int64
	var parts []string
	for _, c := range e.Counts {
		total += c.Values
		parts = append(parts, fmt.Sprintf("%s=%s", c.Encryption, fmt.Sprint(c.Values)))
	}
	return fmt.Sprintf("rollback would put back %s encrypted value(s) (%s) and no encryption configuration says kube-apiserver can read them: give the one it will run with, %s (its --encryption-provider-config) or %s; nothing was written",
		fmt.Sprint(total), strings.Join(parts, ", "), spell(input.APIServerManifest), spell(input.EncryptionProviderConfig))
}

// Refusal is why the rollback must not write what the journals hold, nil
// when it may: journals without checksums (unless allowUnverified), values
// the configuration cannot decrypt, or encrypted values and no
// configuration given.
func (u *UndoCheck) Refusal(allowUnverified bool) error {
	if un := u.Unverified(); len(un) > 0 && !allowUnverified {
		return &UnverifiedJournalError{Journals: un}
	}
	var unreadable, encrypted []ValueCount
	for _, c := range u.Values {
		switch {
		case c.State == ValueUnreadable:
			unreadable = append(unreadable, c)
		case c.State == ValueUnchecked && c.Encryption != encryption.ProviderIdentity:
			encrypted = append(encrypted, c)
		}
	}
	if len(unreadable) > 0 {
		return &UnreadableValuesError{Config: u.EncryptionConfig, Counts: unreadable}
	}
	if len(encrypted) > 0 {
		return &NoEncryptionConfigError{Counts: encrypted}
	}
	return nil
}

// Warning is the warning of a rollback that checks nothing against an
// encryption configuration (none given) and puts back unencrypted values
// only; "" otherwise.
func (u *UndoCheck) Warning(spell func(input.Name) string) string {
	if u.Configured {
		return ""
	}
	var n int64
	for _, c := range u.Values {
		if c.State == ValueUnchecked {
			n += c.Values
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("no encryption configuration given: the %s value(s) put back are unencrypted (identity), which kube-apiserver reads unless its configuration for their resources lacks identity; give %s or %s to check", fmt.Sprint(n), spell(input.APIServerManifest), spell(input.EncryptionProviderConfig))
}

// How a run's undo verifies (RunCheck.Status).
const (
	UndoVerified     = "verified"
	UndoUnverifiable = "unverifiable"
	UndoDamaged      = "damaged"
	// UndoNothing: no journal and no snapshot, and no key written.
	UndoNothing = "nothing to undo"
)

// RunCheck is a run's undo read whole: its journal and its snapshot.
type RunCheck struct {
	Status   string         `json:"status"`
	Journal  *JournalCheck  `json:"journal,omitempty"`
	Snapshot *SnapshotCheck `json:"snapshot,omitempty"`
	// Problems say what does not verify, one line each; Notes what else
	// an operator should know.
	Problems []string `json:"problems,omitempty"`
	Notes    []string `json:"notes,omitempty"`
}

// Verified says whether the undo can be relied on: it verifies, or there is
// nothing to undo.
func (c *RunCheck) Verified() bool { return c.Status == UndoVerified || c.Status == UndoNothing }

// CheckRun reads a run's journal and snapshot whole (CheckJournal,
// CheckSnapshot), every byte of both, against what the run recorded at its
// end.
func CheckRun(ctx context.Context, rec Record) *RunCheck {
	if len(rec.Etcds) == 0 {
		return checkRun(ctx, rec)
	}
	// A run in several etcds (--etcd-servers-overrides): each etcd's undo as
	// that etcd sees it; the keys it wrote are those of all, so a journal
	// gone is damage only when every one is.
	main := rec
	main.Etcds, main.KeysWritten = nil, 0
	rc := checkRun(ctx, main)
	journals := rc.Journal != nil
	for _, e := range rec.Etcds {
		v, _ := rec.InEtcd(e.Name)
		v.KeysWritten = 0
		ec := checkRun(ctx, v)
		journals = journals || ec.Journal != nil
		for _, p := range ec.Problems {
			rc.Problems = append(rc.Problems, "etcd of "+e.Name+": "+p)
		}
		for _, n := range ec.Notes {
			rc.Notes = append(rc.Notes, "etcd of "+e.Name+": "+n)
		}
		rc.Status = worseStatus(rc.Status, ec.Status)
	}
	if rec.KeysWritten > 0 && !journals {
		rc.Status = UndoDamaged
		rc.Problems = append(rc.Problems, fmt.Sprintf("it wrote %d key(s) but its journals (%s and those of its other etcds) are gone", rec.KeysWritten, rec.Journal))
	}
	return rc
}

// worseStatus is the worse of two RunCheck statuses (nothing to undo is
// the best: any undo found says more).
func worseStatus(a, b string) string {
	rank := map[string]int{UndoNothing: 0, UndoVerified: 1, UndoUnverifiable: 2, UndoDamaged: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// checkRun is CheckRun of one etcd's journal and snapshot.
func checkRun(ctx context.Context, rec Record) *RunCheck {
	rc := &RunCheck{Status: UndoVerified}
	damaged := func(s string) {
		rc.Status = UndoDamaged
		rc.Problems = append(rc.Problems, s)
	}
	_, jerr := os.Stat(rec.Journal)
	switch {
	case rec.Journal != "" && jerr == nil:
		jc, err := CheckJournal(ctx, JournalSpec{Path: rec.Journal, Record: &rec}, CheckOptions{Prefix: rec.Prefix})
		if err != nil {
			damaged(textfmt.OneLine(err.Error()))
		} else {
			rc.Journal = jc
			if jc.Status == JournalUnverifiable {
				rc.Status = UndoUnverifiable
				rc.Problems = append(rc.Problems, jc.Line())
			}
		}
	case rec.KeysWritten > 0:
		damaged(fmt.Sprintf("it wrote %d key(s) but its journal %s is gone", rec.KeysWritten, rec.Journal))
	}
	if rec.SnapshotTaken() {
		sc, err := CheckSnapshot(rec.Snapshot, rec.SnapshotSum)
		switch {
		case err != nil:
			damaged(textfmt.OneLine(err.Error()))
		case sc.Problem != "":
			rc.Snapshot = sc
			damaged(sc.Line())
		default:
			rc.Snapshot = sc
		}
	} else if rec.SnapshotSum != nil {
		rc.Notes = append(rc.Notes, fmt.Sprintf("its snapshot %s is gone (recorded at its end: %d bytes, sha256 %s): rollback is the only way back", rec.Snapshot, rec.SnapshotSum.Bytes, rec.SnapshotSum.SHA256))
	}
	if rc.Status == UndoVerified && rc.Journal == nil && rc.Snapshot == nil {
		rc.Status = UndoNothing
	}
	return rc
}
