// Package enctest holds what the tests of encryption at rest share (package
// encryption's and package decode's): public test key material, a marker
// inside every test plaintext, the check that an error message leaks none of
// them, and an aescbc value built as kube-apiserver's provider builds it.
package enctest

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"strings"
	"testing"
)

// Test key material: 32 bytes each, public, protecting nothing.
const (
	Material1 = "decode-test-key-1-not-a-secret!!"
	Material2 = "decode-test-key-2-not-a-secret!!"
	Material3 = "decode-test-key-3-not-a-secret!!"
)

// PlainMarker is inside every test plaintext; no error message may contain it.
const PlainMarker = "hunter2-plaintext-marker"

// Secrets are what no error message may contain: the key material, as written
// and base64-encoded (as a configuration file holds it), and the marker.
var Secrets = []string{Material1, Material2, Material3,
	B64(Material1), B64(Material2), B64(Material3), PlainMarker}

// B64 is s base64-encoded, as an EncryptionConfiguration holds key material.
func B64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// AssertNoSecrets fails t when msg contains any of Secrets.
func AssertNoSecrets(t testing.TB, msg string) {
	t.Helper()
	for _, s := range Secrets {
		if strings.Contains(msg, s) {
			t.Errorf("error message leaks secret material %q: %s", s, msg)
		}
	}
}

// CBCValue builds an aescbc value the way kube-apiserver's provider does for a
// key of that name and material, with a fixed IV so that tests are
// deterministic.
func CBCValue(t testing.TB, keyName, material string, plain []byte) []byte {
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
