package jsondoc

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	v, dups, err := Read([]byte(`{"a":1.0,"b":{"c":1,"c":2},"n":18446744073709551617}` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := v.(map[string]any)
	if m["a"] != json.Number("1.0") || m["n"] != json.Number("18446744073709551617") {
		t.Errorf("number literals not kept: %v", m)
	}
	if m["b"].(map[string]any)["c"] != json.Number("2") {
		t.Errorf("duplicate key: the last value not kept: %v", m["b"])
	}
	if !slices.Equal(dups, []string{"b.c (duplicate key)"}) {
		t.Errorf("duplicates %v", dups)
	}
	for _, bad := range []string{`{"a":1} {}`, `{"a":`, `{"a":1]`, strings.Repeat("[", 10002)} {
		if _, _, err := Read([]byte(bad)); err == nil {
			t.Errorf("Read(%.20q) accepted", bad)
		}
	}
}

func TestDiff(t *testing.T) {
	read := func(s string) any {
		var v any
		if err := json.Unmarshal([]byte(s), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		before, after string
		want          Paths
	}{
		// Numbers by value, whatever the spelling; floats as an encoder writes them again.
		{`{"a":1.0,"b":1e2,"c":0.1}`, `{"a":1,"b":100,"c":0.1}`, Paths{}},
		{`{"a":1}`, `{"a":2}`, Paths{Changed: []string{"a"}}},
		{`{"a":{"b":[1,{"c":"x"}]}}`, `{"a":{"b":[1,{"c":"y"}]}}`, Paths{Changed: []string{"a.b[1].c"}}},
		{`{"a":[1,2]}`, `{"a":[1]}`, Paths{Changed: []string{"a"}}},
		{`{"a":1,"b":2}`, `{"a":1,"c":3}`, Paths{Removed: []string{"b"}, Added: []string{"c"}}},
		{`{"a":1}`, `[1]`, Paths{Changed: []string{"(root)"}}},
		// Under metadata, zero values are not information either way.
		{`{"metadata":{"labels":{},"name":"x","generation":0}}`, `{"metadata":{"name":"x","annotations":{}}}`, Paths{}},
		{`{"metadata":{"labels":{"a":"b"}}}`, `{"metadata":{}}`, Paths{Removed: []string{"metadata.labels"}}},
		{`{"spec":{"x":0}}`, `{"spec":{}}`, Paths{Removed: []string{"spec.x"}}},
	} {
		before, _, err := Read([]byte(tc.before)) // number literals kept
		if err != nil {
			t.Fatal(err)
		}
		got := Diff(before, read(tc.after))
		if !slices.Equal(got.Removed, tc.want.Removed) || !slices.Equal(got.Changed, tc.want.Changed) || !slices.Equal(got.Added, tc.want.Added) {
			t.Errorf("Diff(%s, %s) = %+v, want %+v", tc.before, tc.after, got, tc.want)
		}
	}
	// Read's tree and encoding/json's compare alike.
	a, _, _ := Read([]byte(`{"n":12345678901234567890}`))
	if d := Diff(a, read(`{"n":12345678901234567000}`)); !slices.Equal(d.Changed, []string{"n"}) {
		t.Errorf("an integer beyond float64's precision: %+v", d)
	}
}
