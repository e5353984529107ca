//go:build linux

package encryption

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// memfdCreate is memfd_create(2); tests replace it to take the fallback.
var memfdCreate = unix.MemfdCreate

// memFile puts data in an anonymous file in memory (memfd_create) that only
// this process holds, and returns the path the apiserver's loader reads it by
// (/proc/self/fd/N) and a function that closes it. It is never on a
// filesystem: no crash, kill or power loss can leave it behind. An error
// (an older kernel, a seccomp profile that refuses memfd_create, no /proc)
// leaves the caller to write a private file instead.
func memFile(data []byte) (string, func(), error) {
	fd, err := memfdCreate("kube-etcd-migrate-encryption-config", unix.MFD_CLOEXEC)
	if err != nil {
		return "", nil, err
	}
	f := os.NewFile(uintptr(fd), "memfd")
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return "", nil, err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "", nil, err
	}
	path := fmt.Sprintf("/proc/self/fd/%d", fd)
	// The loader opens the path anew: make sure it can before it is used.
	if b, err := os.ReadFile(path); err != nil || len(b) != len(data) {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s read back %d of %d bytes", path, len(b), len(data))
		}
		return "", nil, err
	}
	return path, func() { f.Close() }, nil
}
