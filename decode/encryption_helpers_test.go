package decode

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Test key material (the captured configuration's and package encryption's
// tests'): 32 bytes each, public, protecting nothing.
const (
	material1 = "decode-test-key-1-not-a-secret!!"
	material2 = "decode-test-key-2-not-a-secret!!"
	material3 = "decode-test-key-3-not-a-secret!!"
)

// plainMarker is inside every test plaintext; no error message may contain it.
const plainMarker = "hunter2-plaintext-marker"

var (
	secretsGR  = schema.GroupResource{Resource: "secrets"}
	allSecrets = []string{material1, material2, material3,
		b64(material1), b64(material2), b64(material3), plainMarker}
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

func assertNoSecrets(t *testing.T, msg string) {
	t.Helper()
	for _, s := range allSecrets {
		if strings.Contains(msg, s) {
			t.Errorf("error message leaks secret material %q: %s", s, msg)
		}
	}
}

// cbcValue encrypts plain as kube-apiserver's aescbc provider would with a key
// of that name and material (fixed IV: tests only).
func cbcValue(t *testing.T, keyName, material string, plain []byte) []byte {
	t.Helper()
	block, err := aes.NewCipher([]byte(material))
	if err != nil {
		t.Fatal(err)
	}
	pad := aes.BlockSize - len(plain)%aes.BlockSize
	body := append(append([]byte{}, plain...), bytes.Repeat([]byte{byte(pad)}, pad)...)
	iv := []byte("fixed-iv-16bytes")
	out := append([]byte("k8s:enc:aescbc:v1:"+keyName+":"), iv...)
	enc := make([]byte, len(body))
	cipher.NewCBCEncrypter(block, iv).CryptBlocks(enc, body)
	return append(out, enc...)
}
