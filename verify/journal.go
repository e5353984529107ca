package verify

import (
	"context"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/undo"
)

const (
	// EncryptionReadable: a journal's old value the configuration decrypts
	// (what a rollback would put back; first or later does not apply).
	EncryptionReadable EncryptionState = "readable"
	// EncryptionQuarantined: a value quarantine removed as unreadable (or
	// not an object): a rollback puts it back as it was, readable or not.
	EncryptionQuarantined EncryptionState = "quarantined"
)

// JournalReport is a run's journal as the key-retirement gate reads it:
// read whole (undo.CheckJournal), and the old values a rollback would put
// back counted by encryption provider and key, each decrypted with the
// configuration given.
type JournalReport struct {
	Check *undo.JournalCheck `json:"check"`
	// Summary counts the values a rollback would put back (Objects), those
	// the configuration decrypts (Current) and those it cannot (Unreadable);
	// values quarantine removed are listed in Encryption only.
	Summary    Counts            `json:"summary"`
	Encryption []EncryptionCount `json:"encryption"`
}

// ExitCode is what verify of this journal alone exits: 4 when a value a
// rollback would put back is one the configuration cannot decrypt, else 0.
func (r *JournalReport) ExitCode() int {
	if r.Summary.Unreadable > 0 {
		return ExitUnreadable
	}
	return ExitCurrent
}

// CheckJournal reads the journal of spec whole and decrypts every value a
// rollback of it would put back with enc; a journal that does not verify is
// an *undo.JournalDamageError.
func CheckJournal(ctx context.Context, spec undo.JournalSpec, enc *encryption.Transformers, prefix string) (*JournalReport, error) {
	jc, err := undo.CheckJournal(ctx, spec, undo.CheckOptions{Encryption: enc, Prefix: prefix})
	if err != nil {
		return nil, err
	}
	r := &JournalReport{Check: jc}
	for _, v := range jc.Values {
		var state EncryptionState
		switch v.State {
		case undo.ValueReadable:
			state = EncryptionReadable
		case undo.ValueUnreadable:
			state = EncryptionUnreadable
			r.Summary.Unreadable += v.Values
		case undo.ValueQuarantined:
			// Put back as it was: not counted, listed.
			r.Encryption = append(r.Encryption, EncryptionCount{Encryption: v.Encryption, State: EncryptionQuarantined, Objects: v.Values})
			continue
		default:
			continue // keys no kube-apiserver reads
		}
		r.Summary.Objects += v.Values
		r.Encryption = append(r.Encryption, EncryptionCount{Encryption: v.Encryption, State: state, Objects: v.Values})
	}
	r.Summary.Current = r.Summary.Objects - r.Summary.Unreadable
	return r, nil
}
