package execpages

import (
	"os"
	"slices"
	"sync"
	"testing"
	"time"
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

// TestStartDropsEarly: the pages a command touches in its first second (the
// most it touches: its packages' initialisation, the first object of every
// kind decoded) are dropped a tenth of a second after, not at the end of the
// second, where the commands' peak resident set was; then every second.
func TestStartDropsEarly(t *testing.T) {
	if len(Mappings()) == 0 {
		t.Skip("no /proc/self/smaps")
	}
	var mu sync.Mutex
	var drops []time.Duration
	began := time.Now()
	release = func(ms []Mapping) int64 {
		mu.Lock()
		drops = append(drops, time.Since(began))
		mu.Unlock()
		return Release(ms)
	}
	Start()
	time.Sleep(Interval*2 + Interval/2)
	mu.Lock()
	defer mu.Unlock()
	// At start, Early times in the first Interval, then every Interval
	// (the timers given half an Interval of slack, for a loaded machine).
	var first int
	for _, d := range drops {
		if d < Interval+Interval/2 {
			first++
		}
	}
	if len(drops) < 2 || drops[1] > Interval/2 || first < 1+Early || len(drops) == first {
		t.Fatalf("drops at %v after Start: want one at once, %d in the first %v (the first of them within %v), then one every %v", drops, Early, Interval, Interval/2, Interval)
	}
}
