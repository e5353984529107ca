package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: from the results files a benchmark writes, the four charts, each
// naming what it shows; a phase that did not run leaves its points out.
func TestRun(t *testing.T) {
	in, out := t.TempDir(), filepath.Join(t.TempDir(), "figures")
	write := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	type s = map[string]any
	dataset := func(name string, n int, def float64) s {
		return s{"dataset": name, "n": n, "keys": n + 21, "date": "2026-11-27T06:00:00Z",
			"floor": s{"window": 15, "snapshotSave": 0.7, "ceilingRewrite": 1.7, "floor": 16.7, "migrateDefaults": def},
			"measurements": []s{
				{"name": "CAS ceiling", "samples": []s{{"seconds": 1.7, "objects": n}}},
				{"name": "migrate (engine)", "samples": []s{{"seconds": 3.1, "objects": n}}},
				{"name": "plan", "samples": []s{{"seconds": 2, "estimateLow": def - 2, "estimateHigh": def + 1}, {"seconds": 2, "estimateLow": def - 1, "estimateHigh": def + 2}}},
			}}
	}
	write("results.json", dataset("mixed", 100000, 25))
	write("results-rotation.json", dataset("rotation", 50000, 24))
	write("results-scale.json", s{"dataset": "snapshot-scale", "n": 25000, "date": "2026-11-27T06:00:00Z", "measurements": []s{
		{"name": "verify --snapshot N", "samples": []s{{"seconds": 1.5, "bytes": 46e6, "peakRSSKiB": 140 << 10, "peakPrivateKiB": 60 << 10}}},
		{"name": "verify --snapshot 4N", "samples": []s{{"seconds": 5.5, "bytes": 184e6, "peakRSSKiB": 144 << 10, "peakPrivateKiB": 62 << 10}}},
	}})
	if err := run(in, out); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string][]string{
		"outage.svg":           {"mixed, 100k", "rotation, 50k", "plan", "floor"},
		"time-vs-size.svg":     {"migrate (defaults)", "CAS ceiling", "engine"},
		"backup-files.svg":     {"scale 4N", "seconds"},
		"backup-files-rss.svg": {"150 MB bound", "100 MB", "peak private memory, MB (RssAnon)"},
	} {
		b, err := os.ReadFile(filepath.Join(out, file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(b), "<?xml") || !strings.Contains(string(b), "<svg") {
			t.Errorf("%s is no SVG", file)
		}
		for _, w := range want {
			if !strings.Contains(string(b), w) {
				t.Errorf("%s does not show %q", file, w)
			}
		}
	}
	// Results written before the private figure was sampled (VmHWM only): no
	// memory chart, the others drawn.
	write("results-scale.json", s{"dataset": "snapshot-scale", "n": 25000, "date": "2026-11-27T06:00:00Z", "measurements": []s{
		{"name": "verify --snapshot N", "samples": []s{{"seconds": 1.5, "bytes": 46e6, "peakRSSKiB": 140 << 10}}},
		{"name": "verify --snapshot 4N", "samples": []s{{"seconds": 5.5, "bytes": 184e6, "peakRSSKiB": 144 << 10}}},
	}})
	old := filepath.Join(t.TempDir(), "figures")
	if err := run(in, old); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(old, "backup-files-rss.svg")); !os.IsNotExist(err) {
		t.Errorf("a memory chart without a private figure: %v", err)
	}
	if _, err := os.Stat(filepath.Join(old, "backup-files.svg")); err != nil {
		t.Error(err)
	}
	// No dataset with outage rows: an error naming the files.
	if err := run(t.TempDir(), out); err == nil || !strings.Contains(err.Error(), "results.json") {
		t.Errorf("no results: %v", err)
	}
}
