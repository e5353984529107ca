package snapshotdb

import "syscall"

// dropRange unmaps the n bytes of the file's mapping at addr from the
// process, madvise(MADV_DONTNEED): the pages stay in the page cache, the
// mapping and bbolt's transaction stay valid, and a later read maps them
// again.
func dropRange(addr, n uintptr) bool {
	if n == 0 {
		return false
	}
	_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, addr, n, syscall.MADV_DONTNEED)
	return errno == 0
}
