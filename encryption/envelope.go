package encryption

import (
	"bytes"
	"crypto/aes"
	"fmt"
	"strconv"

	"golang.org/x/crypto/cryptobyte"
	"golang.org/x/crypto/nacl/secretbox"
	"google.golang.org/protobuf/proto"

	envelopekmsv2 "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2"
	kmstypes "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/kmsv2/v2"
)

// Provider names used in Info.Provider.
const (
	ProviderIdentity  = "identity"
	ProviderAESCBC    = "aescbc"
	ProviderAESGCM    = "aesgcm"
	ProviderSecretbox = "secretbox"
	ProviderKMSv1     = "kms"
	ProviderKMSv2     = "kms2"
	// ProviderUnknown: the value starts with "k8s:enc:" but not with a prefix any
	// kube-apiserver provider writes.
	ProviderUnknown = "unknown"
)

// EncryptedPrefix is reserved by kube-apiserver for encrypted values; the identity
// transformer refuses to read values that start with it.
const EncryptedPrefix = "k8s:enc:"

// providerPrefixes are the prefixes of k8s.io/apiserver's encryptionconfig
// (aesCBCTransformerPrefixV1, ...); the key or KMS provider name and ':' follow.
var providerPrefixes = []struct{ prefix, provider string }{
	{"k8s:enc:aescbc:v1:", ProviderAESCBC},
	{"k8s:enc:aesgcm:v1:", ProviderAESGCM},
	{"k8s:enc:secretbox:v1:", ProviderSecretbox},
	{"k8s:enc:kms:v1:", ProviderKMSv1},
	{"k8s:enc:kms:v2:", ProviderKMSv2},
}

// maxNameInPrefix bounds how far we look for the ':' ending a key name, so that a
// garbage value never turns into a huge "key name".
const maxNameInPrefix = 256

// EnvelopeInfo parses the provider and key (or KMS provider) name from the value's
// prefix alone, without decrypting: "identity" when the value has no "k8s:enc:"
// prefix, ProviderUnknown for an unrecognised "k8s:enc:" prefix, and an empty KeyName
// when the name is not terminated by ':'. A key name that itself contains ':' is cut at
// its first ':' here; Transformers.Decrypt resolves such names against the configuration
// (readEnvelope).
// Stale is always false.
func EnvelopeInfo(value []byte) Info {
	info, _ := splitEnvelope(value)
	return info
}

// splitEnvelope returns the info from the prefix and the offset just after the name's
// ':' (0 for identity, -1 when it cannot be determined).
func splitEnvelope(value []byte) (Info, int) {
	if !bytes.HasPrefix(value, []byte(EncryptedPrefix)) {
		return Info{Provider: ProviderIdentity}, 0
	}
	for _, p := range providerPrefixes {
		if !bytes.HasPrefix(value, []byte(p.prefix)) {
			continue
		}
		rest := value[len(p.prefix):]
		limit := min(len(rest), maxNameInPrefix)
		i := bytes.IndexByte(rest[:limit], ':')
		if i < 0 {
			return Info{Provider: p.provider}, -1
		}
		return Info{Provider: p.provider, KeyName: string(rest[:i])}, len(p.prefix) + i + 1
	}
	return Info{Provider: ProviderUnknown}, -1
}

// readEnvelope is splitEnvelope with the key name resolved against the names
// configured for the value's resource (readable: Transformers.readable): a name
// that itself contains ':' is the longest configured name of the provider
// that, with its ':', follows the provider's prefix.
func readEnvelope(value []byte, readable []Info) (Info, int) {
	info, off := splitEnvelope(value)
	if info.Provider == ProviderIdentity || info.Provider == ProviderUnknown {
		return info, off
	}
	pfx := providerPrefix(info.Provider)
	best := -1
	for _, r := range readable {
		if r.Provider != info.Provider {
			continue
		}
		full := pfx + r.KeyName + ":"
		if bytes.HasPrefix(value, []byte(full)) && len(full) > best {
			info.KeyName, best = r.KeyName, len(full)
		}
	}
	if best > 0 {
		off = best
	}
	return info, off
}

// providerPrefix returns the fixed prefix for a provider name ("" for identity).
func providerPrefix(provider string) string {
	for _, p := range providerPrefixes {
		if p.provider == provider {
			return p.prefix
		}
	}
	return ""
}

// checkBody reports why the bytes after "<prefix><name>:" cannot be a value written by
// the provider, or nil when the structure is plausible (decryption can still fail).
// It rejects exactly what the apiserver's transformers cannot read for structural
// reasons (some of which would make them panic, e.g. a 16-byte AES-CBC body).
func checkBody(provider string, body []byte) error {
	switch provider {
	case ProviderAESCBC:
		return checkCBC(body)
	case ProviderAESGCM:
		return checkGCM(body)
	case ProviderSecretbox:
		if len(body) < 24+secretbox.Overhead {
			return fmt.Errorf("%d bytes after the prefix, secretbox needs at least %d (nonce + tag)", len(body), 24+secretbox.Overhead)
		}
	case ProviderKMSv1:
		s := cryptobyte.String(body)
		var dek cryptobyte.String
		if !s.ReadUint16LengthPrefixed(&dek) {
			return fmt.Errorf("%d bytes after the prefix do not hold the 2-byte length and the encrypted DEK it announces", len(body))
		}
		// The DEK-encrypted data is AES-GCM (since 1.25) or AES-CBC (older writes).
		if checkGCM(s) != nil && checkCBC(s) != nil {
			return fmt.Errorf("%d bytes of data after the encrypted DEK: neither AES-GCM nor AES-CBC", len(s))
		}
	case ProviderKMSv2:
		o := &kmstypes.EncryptedObject{}
		if err := proto.Unmarshal(body, o); err != nil {
			return fmt.Errorf("not a KMS v2 EncryptedObject: %w", err)
		}
		if err := envelopekmsv2.ValidateEncryptedObject(o); err != nil {
			return fmt.Errorf("invalid KMS v2 EncryptedObject: %w", err)
		}
		if err := checkGCM(o.EncryptedData); err != nil {
			return fmt.Errorf("KMS v2 EncryptedObject data: %w", err)
		}
	}
	return nil
}

func checkCBC(body []byte) error {
	// IV + at least one block (PKCS#7 always adds padding).
	if len(body) < 2*aes.BlockSize || len(body)%aes.BlockSize != 0 {
		return fmt.Errorf("%d bytes after the prefix, AES-CBC needs a 16-byte IV and whole 16-byte blocks", len(body))
	}
	return nil
}

func checkGCM(body []byte) error {
	if len(body) < 12+16 {
		return fmt.Errorf("%d bytes after the prefix, AES-GCM needs at least 28 (nonce + tag)", len(body))
	}
	return nil
}

// displayName makes a key name from a value's prefix safe to print: unchanged when it
// is short printable ASCII, else quoted and cut.
func displayName(s string) string {
	ok := len(s) <= 64
	for i := 0; ok && i < len(s); i++ {
		ok = s[i] > ' ' && s[i] < 0x7f && s[i] != '"'
	}
	if ok {
		return s
	}
	if len(s) > 64 {
		s = s[:64]
	}
	return strconv.Quote(s)
}
