package encryption

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// secretValue finds the key material a configuration gives (secret: VALUE,
// as long as a 16-byte key in base64 at least).
var secretValue = regexp.MustCompile(`(?m)secret"?\s*:\s*"?([A-Za-z0-9+/=_-]{24,})`)

// FuzzLoad loads arbitrary files as --encryption-provider-config, as the
// tool does when a manifest maps its KMS sockets (every endpoint mapped, so
// the private copy's path is taken too): nothing panics or hangs; a file
// refused is a *ConfigError, one line naming the file, that never quotes the
// key material in it. The seeds are the configuration the captured values
// were written with and the tests' own, one per provider (and the inputs
// the fuzzing found, in testdata/fuzz/FuzzLoad).
func FuzzLoad(f *testing.F) {
	b, err := os.ReadFile("../testdata/captured/encryption-config.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	key := strings.Repeat("k", 32)
	for _, c := range []string{
		secretsConfig(keyed("aescbc", "key2", key, "key1", key), identityProvider),
		secretsConfig(keyed("aesgcm", "k", key[:16])),
		secretsConfig(keyed("secretbox", "k", key)),
		secretsConfig(kmsV2("plugin", "unix:///run/kms/plugin.sock"), identityProvider),
		secretsConfig(kmsV1("old", "unix:///run/kms/old.sock")),
		configYAML(entry{[]string{"*.*"}, []string{identityProvider}}, entry{[]string{"configmaps", "*.apps"}, []string{keyed("aescbc", "a", key)}}),
	} {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "encryption-config.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		// Fuzzing has no deadline per input: crash on a hang instead, so
		// that the engine records the input.
		watchdog := time.AfterFunc(30*time.Second, func() { panic(fmt.Sprintf("loading %q hangs", data)) })
		defer watchdog.Stop()
		mapped := func(endpoint string) (string, error) { return "unix://" + filepath.Join(dir, "kms.sock"), nil }
		e, err := LoadWith(context.Background(), path, Options{MapKMSEndpoint: mapped})
		if err == nil {
			e.Close()
			return
		}
		var ce *ConfigError
		msg := err.Error()
		if !errors.As(err, &ce) || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "encryption configuration "+path+": ") {
			t.Fatalf("%q: want a one-line *ConfigError naming the file", msg)
		}
		// The words of the messages themselves are no key material.
		words := strings.NewReplacer("EncryptionConfiguration", "", "apiserver.config.k8s.io", "").Replace(msg)
		for _, m := range secretValue.FindAllSubmatch(data, -1) {
			if bytes.Contains([]byte(words), m[1]) {
				t.Fatalf("the error quotes the key material %q: %q", m[1], msg)
			}
		}
	})
}
