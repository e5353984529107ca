package encryption

// Info says how a value was (or will be) encrypted at rest. It never
// carries key material.
type Info struct {
	// Provider is "identity", "aescbc", "aesgcm", "secretbox", "kms" (KMS v1) or
	// "kms2" (KMS v2), read from the value's prefix.
	Provider string `json:"provider"`
	// KeyName is the key (aescbc/aesgcm/secretbox) or KMS provider name from the
	// value's prefix; empty for identity.
	KeyName string `json:"keyName,omitempty"`
	// Stale is true when the configured transformer reported the value stale: read
	// by a provider or key that is not the one new writes use (KMS v2: a different
	// key ID than the plugin's current one).
	Stale bool `json:"stale,omitempty"`
}

// String gives "provider:key" or "identity".
func (e Info) String() string {
	if e.KeyName == "" {
		return e.Provider
	}
	return e.Provider + ":" + e.KeyName
}
