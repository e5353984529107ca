package undo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/snapshotdb"
)

// SnapshotCheck is a run's snapshot file read whole.
type SnapshotCheck struct {
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Trailer: etcd's sha256 trailer matches the database.
	Trailer bool `json:"trailer"`
	// SQLite: the snapshot is a copy of a SQLite datastore (a run on k3s's
	// or RKE2's datastore through kine), which has no trailer: the checksum
	// its run recorded is what verifies it.
	SQLite bool `json:"sqlite,omitempty"`
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
	sc := &SnapshotCheck{Path: path, Bytes: d.Size, SHA256: d.SHA256, Trailer: d.Trailer, SQLite: isSQLite(path)}
	switch {
	case want != nil && (want.Bytes != d.Size || want.SHA256 != d.SHA256):
		sc.Problem = fmt.Sprintf("not what its run recorded at its end (%d bytes, sha256 %s; now %d bytes, %s)", want.Bytes, want.SHA256, d.Size, d.SHA256)
	case sc.SQLite:
		// A SQLite copy has no trailer: the sum its run recorded verifies it.
		sc.Sealed = want != nil
	case !d.HasTrailer:
		sc.Problem = "no etcd sha256 trailer: truncated, or not a snapshot etcd saved"
	case !d.Trailer:
		sc.Problem = "its database does not match etcd's sha256 trailer: corrupt"
	default:
		sc.Sealed = want != nil
	}
	return sc, nil
}

// sqliteHeader begins every SQLite database file (sqlite.org/fileformat.html).
const sqliteHeader = "SQLite format 3\x00"

// isSQLite says whether the file at path begins as a SQLite database does.
func isSQLite(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(sqliteHeader))
	_, err = io.ReadFull(f, b)
	return err == nil && string(b) == sqliteHeader
}

// Line says in one line how the snapshot verified.
func (s *SnapshotCheck) Line() string {
	switch {
	case s.Problem != "":
		return fmt.Sprintf("snapshot %s is DAMAGED: %s", s.Path, s.Problem)
	case s.SQLite && s.Sealed:
		return fmt.Sprintf("snapshot %s verified (a copy of the SQLite datastore; sha256 %s, as recorded at its run's end)", s.Path, s.SHA256)
	case s.SQLite:
		return fmt.Sprintf("snapshot %s: a copy of the SQLite datastore whose run recorded no checksum (it did not record its end): not verified; sha256 %s", s.Path, s.SHA256)
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
	if rec.Snapshot == "" {
		return fmt.Sprintf("run %s kept no snapshot (its journal alone was its undo): restore the last backup from before it (on PostgreSQL or MySQL, the dump taken before it)", rec.ID)
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
	if sc.SQLite && !sc.Sealed {
		how = "a copy of the SQLite datastore; its run recorded no checksum"
	}
	if sc.Sealed {
		how = "sha256 " + sc.SHA256 + " matches the checksum recorded at its run's end"
	}
	if sc.SQLite {
		return fmt.Sprintf("run %s's snapshot %s is the way back to the state before it (%s): with k3s (or RKE2) stopped, copy it in place of the SQLite datastore and remove the datastore's -wal and -shm files", rec.ID, rec.Snapshot, how)
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
