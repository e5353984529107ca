package seed

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
)

// encryptionConfigTemplate is an EncryptionConfiguration for secrets: aescbc with
// the given keys (the first one writes), identity last so that secrets written
// before encryption was enabled stay readable.
const encryptionConfigTemplate = `apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources:
      - secrets
    providers:
      - aescbc:
          keys:
%s      - identity: {}
`

// WriteEncryptionConfigs writes two kube-apiserver EncryptionConfiguration files
// (mode 0600) into dir and returns their paths:
//
//	old: secrets -> aescbc [key1], identity
//	new: secrets -> aescbc [key2, key1], identity (key2 first: a key rotation)
//
// The two 32-byte AES keys are random on every call.
func WriteEncryptionConfigs(dir string) (oldPath, newPath string, err error) {
	key1, err := randomKey()
	if err != nil {
		return "", "", err
	}
	key2, err := randomKey()
	if err != nil {
		return "", "", err
	}
	entry := func(name, secret string) string {
		return fmt.Sprintf("            - name: %s\n              secret: %s\n", name, secret)
	}
	oldPath = filepath.Join(dir, "encryption-config-old.yaml")
	newPath = filepath.Join(dir, "encryption-config-new.yaml")
	if err := writeFile0600(oldPath, fmt.Sprintf(encryptionConfigTemplate, entry("key1", key1))); err != nil {
		return "", "", err
	}
	if err := writeFile0600(newPath, fmt.Sprintf(encryptionConfigTemplate, entry("key2", key2)+entry("key1", key1))); err != nil {
		return "", "", err
	}
	return oldPath, newPath, nil
}

func randomKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate AES key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func writeFile0600(path, content string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	// OpenFile's mode is only used on creation; tighten an existing file too.
	return os.Chmod(path, 0o600)
}
