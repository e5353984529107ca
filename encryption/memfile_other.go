//go:build !linux

package encryption

import "errors"

// memFile has no anonymous memory file outside Linux: the caller writes a
// private file instead.
func memFile([]byte) (string, func(), error) {
	return "", nil, errors.New("no memfd_create on this system")
}
