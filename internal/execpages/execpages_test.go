package execpages

import (
	"os"
	"slices"
	"testing"
)

// TestFileMappings: of a process's mappings, only the executable's that
// cannot be written and hold no page of the process's own are dropped.
func TestFileMappings(t *testing.T) {
	smaps := []byte(`00400000-03083000 r-xp 00000000 fe:00 10002546                           /usr/bin/kube-etcd-migrate
Size:              45580 kB
Rss:               32968 kB
Anonymous:             0 kB
03083000-060e9000 r--p 02c83000 fe:00 10002546                           /usr/bin/kube-etcd-migrate
Rss:               45656 kB
Anonymous:             0 kB
060e9000-061ea000 rw-p 05ce9000 fe:00 10002546                           /usr/bin/kube-etcd-migrate
Anonymous:           296 kB
061ea000-061fa000 r--p 05dea000 fe:00 10002546                           /usr/bin/kube-etcd-migrate
Anonymous:             4 kB
7f0000000000-7f0000100000 r--p 00000000 fe:00 42                         /usr/bin/kube-etcd-migrate (deleted)
Anonymous:             0 kB
7f0000200000-7f0000300000 r--p 00000000 fe:00 43                         /var/lib/etcd/member/snap/db
Anonymous:             0 kB
7f0000400000-7f0000500000 rw-p 00000000 00:00 0 
Anonymous:          1024 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Anonymous:           132 kB
`)
	got := fileMappings(smaps, "/usr/bin/kube-etcd-migrate")
	want := []Mapping{{0x400000, 0x3083000}, {0x3083000, 0x60e9000}}
	if !slices.Equal(got, want) {
		t.Fatalf("dropped %x, want %x", got, want)
	}
}

// TestRelease: in this process (the test binary), the executable's
// read-only mappings are found and dropped, and the code keeps running.
func TestRelease(t *testing.T) {
	if _, err := os.Stat("/proc/self/smaps"); err != nil {
		t.Skip("no /proc/self/smaps")
	}
	if n := Release(Mappings()); n <= 0 {
		t.Fatalf("released %d bytes of the test binary's mappings", n)
	}
	// Run code and read data the drop unmapped.
	if got := slices.Index([]string{"a", "b"}, "b"); got != 1 {
		t.Fatal(got)
	}
}
