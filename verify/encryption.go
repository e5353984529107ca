package verify

import (
	"sort"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// EncryptionState says where an object's encryption provider and key stand
// in the EncryptionConfiguration the run was given, for its resource.
type EncryptionState string

const (
	// EncryptionFirst: the first provider and key, what kube-apiserver writes.
	EncryptionFirst EncryptionState = "first"
	// EncryptionLater: a later provider or key of the configuration: readable,
	// but not what kube-apiserver writes (stale by encryption).
	EncryptionLater EncryptionState = "later"
	// EncryptionUnreadable: no provider of the configuration decrypts it (its
	// key is not in the configuration, the KMS plugin is down or refuses it,
	// or the envelope is corrupt).
	EncryptionUnreadable EncryptionState = "unreadable"
)

// EncryptionCount is how many objects are stored under one provider and key
// ("aescbc:key1", "kms2:vault", "identity") in one state.
type EncryptionCount struct {
	Encryption string          `json:"encryption"`
	State      EncryptionState `json:"state"`
	Objects    int64           `json:"objects"`
}

type encryptionKey struct {
	name  string
	state EncryptionState
}

// addEncryption counts a decision's object under its provider and key.
// Orphaned keys and keys that are not objects are not counted: kube-apiserver
// never reads them.
func (r *Report) addEncryption(env *pipeline.Env, d *reencode.Decision) {
	name := d.From.Encryption
	if name == "" {
		name = "?"
	}
	var state EncryptionState
	switch d.Status {
	case reencode.Current:
		state = EncryptionFirst
	case reencode.Stale:
		state = EncryptionFirst
		for _, reason := range d.Reasons {
			if reason == reencode.ReasonEncryption {
				state = EncryptionLater
			}
		}
	default:
		reason, _ := d.ErrorReason()
		switch {
		case reason == decode.ReasonUndecryptable || reason == decode.ReasonCorruptEnvelope:
			state = EncryptionUnreadable
		case env.Planner != nil && env.Planner.Encryption != nil:
			// Decrypted, then unreadable for another reason: where its key stands.
			state = EncryptionLater
			if env.Planner.Encryption.WriteProvider(d.Resource).String() == name {
				state = EncryptionFirst
			}
		case name == encryption.ProviderIdentity:
			state = EncryptionFirst // no configuration: identity is what is written
		default:
			state = EncryptionUnreadable
		}
	}
	if r.encryption == nil {
		r.encryption = map[encryptionKey]int64{}
	}
	r.encryption[encryptionKey{name, state}]++
}

// encryptionCounts lists the counts, the keys that need attention first
// (unreadable, then later), then by name.
func (r *Report) encryptionCounts() []EncryptionCount {
	out := make([]EncryptionCount, 0, len(r.encryption))
	for k, n := range r.encryption {
		out = append(out, EncryptionCount{Encryption: k.name, State: k.state, Objects: n})
	}
	rank := map[EncryptionState]int{EncryptionUnreadable: 0, EncryptionLater: 1, EncryptionFirst: 2}
	sort.Slice(out, func(i, j int) bool {
		if a, b := rank[out[i].State], rank[out[j].State]; a != b {
			return a < b
		}
		return out[i].Encryption < out[j].Encryption
	})
	return out
}

// NeedsMissingKey lists the providers and keys of the objects no provider of
// the configuration decrypts (EncryptionUnreadable), e.g. ["aescbc:key1"].
func NeedsMissingKey(counts []EncryptionCount) []string {
	var out []string
	for _, c := range counts {
		if c.State == EncryptionUnreadable {
			out = append(out, c.Encryption)
		}
	}
	return out
}
