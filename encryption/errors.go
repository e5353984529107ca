package encryption

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// DecryptError is why Transformers.Decrypt cannot read a stored value. Detail
// names the provider and key name; it never holds plaintext or key material.
type DecryptError struct {
	Key string
	// Corrupt is true when the envelope itself is malformed (no prefix a
	// provider writes, no key name, a body its provider cannot have written);
	// false when the configuration cannot decrypt it (no such key, wrong key
	// material, a KMS plugin that refused).
	Corrupt bool
	Detail  string
}

// Reason is "corrupt-envelope" or "undecryptable", the names package decode
// gives these failures.
func (e *DecryptError) Reason() string {
	if e.Corrupt {
		return "corrupt-envelope"
	}
	return "undecryptable"
}

func (e *DecryptError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.Key, e.Reason(), e.Detail)
}

func decryptErrorf(key string, corrupt bool, format string, args ...any) *DecryptError {
	return &DecryptError{Key: key, Corrupt: corrupt, Detail: fmt.Sprintf(format, args...)}
}

// neverEncrypted are the group/resources of the objects kube-apiserver writes
// outside a resource's REST storage (masterleases, peer server leases, the
// service IP and node port allocations; package decode's raw-storage keys).
var neverEncrypted = map[schema.GroupResource]bool{
	{Resource: "apiServerIPInfo"}:            true,
	{Resource: "apiServerPeerIPInfo"}:        true,
	{Resource: "serviceipallocations"}:       true,
	{Resource: "servicenodeportallocations"}: true,
}

// NeverEncrypted reports whether kube-apiserver stores gr unencrypted whatever
// its encryption configuration says: the raw-storage objects it writes outside
// a resource's REST storage, whose storage carries no encryption transformer
// (its identity transformer refuses encrypted values). Transformers reads and
// writes them the same way.
func NeverEncrypted(gr schema.GroupResource) bool { return neverEncrypted[gr] }
