package encryption

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/testrig/enctest"
	"kube-etcd-migrate/internal/testrig/kmstest"
)

// containerEndpoint is where kube-apiserver, in its container, would reach the
// test plugin; nothing listens there on the machine running the tests.
const containerEndpoint = "unix:///var/run/kmsplugin/kms.sock"

// seenCopy is what a test sees of a private copy LoadWith makes: where it
// is, its permissions, its directory's, whether $TMPDIR held anything while
// it was loaded, and whether it holds the container endpoint or the mapped
// one.
type seenCopy struct {
	path             string
	file, dir        os.FileMode
	onDisk           []string
	mapped, original bool
}

func watchPrivateCopies(t *testing.T, mapped string) *[]seenCopy {
	t.Helper()
	var seen []seenCopy
	privateCopyHook = func(file string) {
		c := seenCopy{path: file}
		if des, err := os.ReadDir(os.TempDir()); err == nil {
			for _, de := range des {
				c.onDisk = append(c.onDisk, de.Name())
			}
		}
		if fi, err := os.Stat(file); err == nil {
			c.file = fi.Mode().Perm()
		}
		if fi, err := os.Stat(filepath.Dir(file)); err == nil {
			c.dir = fi.Mode().Perm()
		}
		data, _ := os.ReadFile(file)
		c.mapped = bytes.Contains(data, []byte(mapped))
		c.original = bytes.Contains(data, []byte(containerEndpoint))
		seen = append(seen, c)
	}
	t.Cleanup(func() { privateCopyHook = nil })
	return &seen
}

// TestMapKMSEndpoints: with a mapping, a KMS v2 provider written with a path
// that only exists in kube-apiserver's container reaches the real plugin
// listening at the mapped path, every other provider, key and resource of the
// file stays as written, and the private copy the apiserver's loader reads is
// 0600 in a 0700 directory and gone once loaded. Without the mapping the same
// file dials the container path and nothing decrypts.
func TestMapKMSEndpoints(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	configMapsGR := schema.GroupResource{Resource: "configmaps"}
	written := configYAML(
		entry{[]string{"secrets"}, []string{kmsV2("kms2a", containerEndpoint), keyed("aescbc", "key1", enctest.Material1, "key2", enctest.Material2), identityProvider}},
		entry{[]string{"configmaps", "*.apps"}, []string{keyed("secretbox", "key3", enctest.Material3), kmsV2("kms2b", containerEndpoint)}},
	)
	path := writeConfig(t, written)
	// What kube-apiserver wrote with: the same file, seen from its container.
	writer := loadT(t, strings.ReplaceAll(written, containerEndpoint, plugin.Endpoint()))
	ct := encryptT(t, writer, secretKey, testPlain)
	if !bytes.HasPrefix(ct, []byte("k8s:enc:kms:v2:kms2a:")) {
		t.Fatalf("the writer did not use the KMS v2 plugin: %q", ct)
	}

	var asked []string
	mapEndpoint := func(ep string) (string, error) {
		asked = append(asked, ep)
		if ep == containerEndpoint {
			return plugin.Endpoint(), nil
		}
		return ep, nil
	}
	copies := watchPrivateCopies(t, plugin.Endpoint())
	mapped, err := LoadWith(ctx, path, Options{MapKMSEndpoint: mapEndpoint})
	if err != nil {
		t.Fatalf("LoadEncryptionWith: %v", err)
	}
	defer mapped.Close()
	if len(asked) != 2 || asked[0] != containerEndpoint || asked[1] != containerEndpoint {
		t.Errorf("the mapping was asked for %q, want the container endpoint once per KMS provider", asked)
	}
	if len(*copies) != 1 {
		t.Fatalf("%d private copies loaded, want 1", len(*copies))
	}
	// In this process's memory only: nothing in $TMPDIR even while loading,
	// so a kill -9 then leaves no key on disk.
	if c := (*copies)[0]; !strings.HasPrefix(c.path, "/proc/self/fd/") || c.file != 0o600 || len(c.onDisk) != 0 || !c.mapped || c.original {
		t.Errorf("private copy: %s, file %v, $TMPDIR holding %v while loading, mapped endpoint %v, container endpoint %v; want an anonymous memory file (/proc/self/fd/N) 0600, nothing on disk, true, false", c.path, c.file, c.onDisk, c.mapped, c.original)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in $TMPDIR after loading: %v", left)
	}
	if mapped.Path != path {
		t.Errorf("Path %q, want the file given, %q", mapped.Path, path)
	}

	// Everything but the endpoint is the file as written: same resources,
	// providers in the same order, same key names and secrets.
	want := loadT(t, strings.ReplaceAll(written, containerEndpoint, plugin.Endpoint()))
	if !reflect.DeepEqual(mapped.config, want.config) {
		t.Errorf("the mapped configuration is not the file as written with the endpoint replaced")
	}
	for gr, w := range map[schema.GroupResource]Info{
		secretsGR:                                {Provider: ProviderKMSv2, KeyName: "kms2a"},
		configMapsGR:                             {Provider: ProviderSecretbox, KeyName: "key3"},
		{Group: "apps", Resource: "deployments"}: {Provider: ProviderSecretbox, KeyName: "key3"},
	} {
		if got := mapped.WriteProvider(gr); got != w {
			t.Errorf("%s: write provider %v, want %v", gr, got, w)
		}
	}

	decrypts := plugin.DecryptCalls()
	pt, info, err := mapped.Decrypt(ctx, secretsGR, secretKey, ct)
	if err != nil {
		t.Fatalf("Decrypt through the mapped endpoint: %v", err)
	}
	if !bytes.Equal(pt, testPlain) || info.Provider != ProviderKMSv2 || info.KeyName != "kms2a" {
		t.Errorf("Decrypt = %q, %+v; want the plaintext from kms2:kms2a", pt, info)
	}
	if plugin.DecryptCalls() == decrypts {
		t.Errorf("the plugin served no Decrypt: the value was not read through it")
	}
	if err := mapped.Preflight(ctx, []schema.GroupResource{secretsGR}); err != nil {
		t.Errorf("Preflight through the mapped endpoint: %v", err)
	}

	// The same file without the mapping dials the container path.
	unmapped := loadT(t, written)
	_, _, err = unmapped.Decrypt(ctx, secretsGR, secretKey, ct)
	wantDecodeError(t, err, secretKey, reasonUndecryptable, "kms2:kms2a")
	err = unmapped.Preflight(ctx, []schema.GroupResource{secretsGR})
	if err == nil || !strings.Contains(err.Error(), containerEndpoint) {
		t.Errorf("Preflight without the mapping: %v; want an error naming %s", err, containerEndpoint)
	}
}

// TestMapKMSEndpointsWithoutMemfd: where memfd_create is refused (an older
// kernel, a seccomp profile), the private copy is a file 0600 in a 0700
// directory of $TMPDIR, removed once loaded, and the load works the same.
func TestMapKMSEndpointsWithoutMemfd(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	orig := memfdCreate
	memfdCreate = func(string, int) (int, error) { return -1, syscall.ENOSYS }
	t.Cleanup(func() { memfdCreate = orig })
	copies := watchPrivateCopies(t, plugin.Endpoint())

	written := secretsConfig(kmsV2("kms2a", containerEndpoint), keyed("aescbc", "key1", enctest.Material1))
	writer := loadT(t, strings.ReplaceAll(written, containerEndpoint, plugin.Endpoint()))
	ct := encryptT(t, writer, secretKey, testPlain)
	mapped, err := LoadWith(ctx, writeConfig(t, written), Options{MapKMSEndpoint: func(string) (string, error) { return plugin.Endpoint(), nil }})
	if err != nil {
		t.Fatalf("LoadWith: %v", err)
	}
	defer mapped.Close()
	if len(*copies) != 1 {
		t.Fatalf("%d private copies loaded, want 1", len(*copies))
	}
	if c := (*copies)[0]; filepath.Dir(filepath.Dir(c.path)) != tmp || c.file != 0o600 || c.dir != 0o700 || !c.mapped || c.original {
		t.Errorf("private copy: %s, file %v, directory %v, mapped endpoint %v, container endpoint %v; want a file in $TMPDIR, 0600, 0700, true, false", c.path, c.file, c.dir, c.mapped, c.original)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in $TMPDIR after loading: %v", left)
	}
	if pt, _, err := mapped.Decrypt(ctx, secretsGR, secretKey, ct); err != nil || !bytes.Equal(pt, testPlain) {
		t.Errorf("Decrypt through the mapped endpoint: %v", err)
	}
}

// TestMapKMSEndpointsKeepsOrRefuses: a mapping that changes nothing makes no
// copy; one that fails stops the load with an error naming the file and the
// provider (never a secret); a file kube-apiserver would refuse (an unknown
// field) is refused before any copy is written.
func TestMapKMSEndpointsKeepsOrRefuses(t *testing.T) {
	ctx := context.Background()
	plugin := kmstest.StartV2T(t, "kek-1")
	t.Setenv("TMPDIR", t.TempDir())
	copies := watchPrivateCopies(t, plugin.Endpoint())

	same := writeConfig(t, secretsConfig(kmsV2("kms2a", plugin.Endpoint()), keyed("aescbc", "key1", enctest.Material1)))
	e, err := LoadWith(ctx, same, Options{MapKMSEndpoint: func(ep string) (string, error) { return ep, nil }})
	if err != nil {
		t.Fatalf("unchanged endpoints: %v", err)
	}
	e.Close()
	if len(*copies) != 0 {
		t.Errorf("unchanged endpoints: %d private copies, want none", len(*copies))
	}

	refused := writeConfig(t, secretsConfig(keyed("aescbc", "key1", enctest.Material1), kmsV2("kms2a", containerEndpoint)))
	_, err = LoadWith(ctx, refused, Options{MapKMSEndpoint: func(ep string) (string, error) {
		return "", errors.New("not under any hostPath volume")
	}})
	if err == nil {
		t.Fatal("a refused endpoint: loaded")
	}
	for _, w := range []string{refused, `kms provider "kms2a"`, "not under any hostPath volume"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
	enctest.AssertNoSecrets(t, err.Error())

	unknown := writeConfig(t, strings.Replace(secretsConfig(kmsV2("kms2a", containerEndpoint), keyed("aescbc", "key1", enctest.Material1)), "timeout: 3s", "timeout: 3s, retries: 2", 1))
	_, err = LoadWith(ctx, unknown, Options{MapKMSEndpoint: func(string) (string, error) { return plugin.Endpoint(), nil }})
	if err == nil || !strings.Contains(err.Error(), "retries") || !strings.Contains(err.Error(), unknown) {
		t.Errorf("unknown field: %v; want an error naming the field and the file", err)
	} else {
		enctest.AssertNoSecrets(t, err.Error())
	}
	// YAML broken by a missing space after a colon: the key and its secret
	// are one unknown field's name, not quoted (FuzzLoad found it quoted).
	broken := writeConfig(t, "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - aescbc: {keys: [{name: key1, secret:\""+enctest.Material1+"\"}]}\n")
	_, err = LoadWith(ctx, broken, Options{})
	if err == nil || !strings.Contains(err.Error(), `unknown field "resources[0].providers[0].aescbc.keys[0].<`) || !strings.Contains(err.Error(), "characters not shown>") {
		t.Errorf("a secret in an unknown field's name: %v; want the field's path, its name not shown", err)
	} else {
		enctest.AssertNoSecrets(t, err.Error())
	}
	if len(*copies) != 0 {
		t.Errorf("%d private copies written for refused files, want none", len(*copies))
	}
}
