package snapshotdb

import (
	"encoding/binary"
	"errors"
	"io"
	"os"
)

// boltMagic is the magic number bbolt writes in its meta pages, at byte 16 of
// the file (after the first page's 16-byte header), in the byte order of the
// machine that wrote it.
const boltMagic = 0xED0CDAED

// LooksLikeDatabase says whether the file at path starts as a bbolt database
// does (etcd's storage engine; every etcd snapshot and member/snap/db is one),
// without checking anything else: it is how a directory of backups is told
// apart from the other files it holds (checksums, notes, compressed copies).
// A file that looks like one may still be damaged: Open checks it.
func LooksLikeDatabase(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var head [20]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, nil
		}
		return false, err
	}
	return binary.LittleEndian.Uint32(head[16:]) == boltMagic || binary.BigEndian.Uint32(head[16:]) == boltMagic, nil
}
