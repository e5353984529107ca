package encryption

import "fmt"

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
