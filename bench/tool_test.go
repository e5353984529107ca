package main

import (
	"os"
	"strings"
	"testing"
)

// TestParseStatus: VmHWM and RssAnon are taken from a /proc/PID/status text,
// the other Rss and Vm lines left alone; a field missing is 0.
func TestParseStatus(t *testing.T) {
	const status = "Name:\tkube-etcd-migra\n" +
		"State:\tS (sleeping)\n" +
		"VmPeak:\t 1312440 kB\n" +
		"VmSize:\t 1312440 kB\n" +
		"VmHWM:\t  148212 kB\n" +
		"VmRSS:\t  141904 kB\n" +
		"RssAnon:\t   61300 kB\n" +
		"RssFile:\t   80604 kB\n" +
		"RssShmem:\t       0 kB\n" +
		"Threads:\t9\n"
	if hwm, anon := parseStatus([]byte(status)); hwm != 148212 || anon != 61300 {
		t.Errorf("parseStatus = VmHWM %d, RssAnon %d KiB; want 148212, 61300", hwm, anon)
	}
	// A zombie's status has no memory lines.
	if hwm, anon := parseStatus([]byte("Name:\tx\nState:\tZ (zombie)\n")); hwm != 0 || anon != 0 {
		t.Errorf("parseStatus of a zombie = %d, %d; want 0, 0", hwm, anon)
	}
}

// TestProcMemory: the test's own process has private memory (its heap and
// stacks), no more than its peak resident set; a process that is gone has none.
func TestProcMemory(t *testing.T) {
	hwm, anon := procMemory(os.Getpid())
	if anon <= 0 || hwm < anon {
		t.Errorf("procMemory(self) = VmHWM %d, RssAnon %d KiB; want 0 < RssAnon <= VmHWM", hwm, anon)
	}
	if hwm, anon := procMemory(-1); hwm != 0 || anon != 0 {
		t.Errorf("procMemory(-1) = %d, %d; want 0, 0", hwm, anon)
	}
}

// TestPrivateMemoryInTable: a row's private memory is its memory column, its
// peak RSS beside it.
func TestPrivateMemoryInTable(t *testing.T) {
	res := &results{Dataset: "mixed"}
	m := res.get(mVerify)
	m.Samples = []sample{
		{Seconds: 1, Objects: 10, PeakPrivateKB: 60 << 10, PeakRSSKB: 120 << 10},
		{Seconds: 1, Objects: 10, PeakPrivateKB: 64 << 10, PeakRSSKB: 124 << 10},
		{Seconds: 1, Objects: 10, PeakPrivateKB: 62 << 10, PeakRSSKB: 122 << 10},
	}
	m.finish()
	if m.PeakPrivateMB != (stat{Median: 62, Min: 60, Max: 64}) || m.PeakRSSMB.Max != 124 {
		t.Fatalf("finish: private %+v, RSS %+v", m.PeakPrivateMB, m.PeakRSSMB)
	}
	f, err := os.CreateTemp(t.TempDir(), "table")
	if err != nil {
		t.Fatal(err)
	}
	printTable(f, res)
	f.Close()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"peak private MB", "peak RSS MB (VmHWM)", "62 [60–64]", "122 [120–124]"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the table has no %q:\n%s", want, b)
		}
	}
}

// TestPrivateRatio: a memory target judges the row's largest private figure,
// a ceiling, with its peak RSS in the note.
func TestPrivateRatio(t *testing.T) {
	m := &measurement{Name: "verify", PeakPrivateMB: stat{Median: 90, Min: 80, Max: 101}, PeakRSSMB: stat{Max: 140}}
	r := privateRatio(m, 100)
	if r.Name != "peak private MB, verify" || r.Value != 101 || r.Target != 100 || r.Met || !r.AtMost || !strings.Contains(r.Note, "140 MB") {
		t.Errorf("privateRatio = %+v", r)
	}
	if m.PeakPrivateMB.Max = 99; !privateRatio(m, 100).Met {
		t.Error("99 MB against 100: not met")
	}
}
