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
	// Plugin is set when a KMS plugin did not answer the call this value
	// needed (Unreachable): no fault of the value; every value under a data
	// key not yet decrypted needs the plugin too (KMSPluginError).
	Plugin *KMSPluginError
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
	if e.Plugin != nil {
		return fmt.Sprintf("%s: %s: %s: %s", e.Key, e.Reason(), e.Detail, e.Plugin)
	}
	return fmt.Sprintf("%s: %s: %s", e.Key, e.Reason(), e.Detail)
}

// Unwrap is the plugin that did not answer, if any.
func (e *DecryptError) Unwrap() error {
	if e.Plugin == nil {
		return nil
	}
	return e.Plugin
}

// EncryptError is a value the write provider could not encrypt: no fault of
// the value, and no other value of the provider can be written either.
// Plugin is set for a KMS provider. Stopped says that the provider had
// encrypted in this run (the preflight's probe, or a value) and stopped
// since: a KMS v2 plugin gone for longer than kube-apiserver's transformer
// keeps writing with its data key, a KMS v1 plugin that no longer answers.
type EncryptError struct {
	Key      string
	Provider Info
	Plugin   *KMSPluginError
	Stopped  bool
	Err      error
}

func (e *EncryptError) Error() string {
	if e.Plugin != nil {
		return fmt.Sprintf("%s: encrypt with %s: %s", e.Key, e.Provider, e.Plugin)
	}
	return fmt.Sprintf("%s: encrypt with %s: %v", e.Key, e.Provider, e.Err)
}

func (e *EncryptError) Unwrap() error {
	if e.Plugin != nil {
		return e.Plugin
	}
	return e.Err
}

func decryptErrorf(key string, corrupt bool, format string, args ...any) *DecryptError {
	return &DecryptError{Key: key, Corrupt: corrupt, Detail: fmt.Sprintf(format, args...)}
}
