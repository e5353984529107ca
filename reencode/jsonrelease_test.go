package reencode

import (
	"strings"
	"testing"

	"kube-etcd-migrate/release"
)

// TestReleaseJSON: a JSON object written by this release's types, as an
// older release's types write it: their member order, the zero values they
// write and these leave out, without the zero-valued members they lack; a
// lacking member with a value is an error naming its path; nothing to
// change gives back the same bytes.
func TestReleaseJSON(t *testing.T) {
	rt := release.Types{Release: "1.0", JSON: map[string][]release.JSONField{
		"T":           {{Name: "a"}, {Name: "d", Zero: "null"}, {Name: "s", Type: "S"}, {Name: "m", Type: "T.M[values]"}, {Name: "l", Type: "S"}},
		"S":           {{Name: "x"}},
		"T.M[values]": {{Name: "*", Type: "S"}},
	}}
	for _, tc := range []struct{ in, want, err string }{
		{in: `{"a":1,"d":[1],"s":{"x":2}}` + "\n", want: `{"a":1,"d":[1],"s":{"x":2}}` + "\n"},
		{in: `{"a":1,"s":{"x":2,"new":{}},"status":{}}` + "\n", want: `{"a":1,"d":null,"s":{"x":2}}` + "\n"},
		{in: `{"s":{"x":"<\u0026>"},"a":"é"}`, want: `{"a":"é","d":null,"s":{"x":"<\u0026>"}}`},
		{in: `{"a":1,"d":null,"m":{"k1":{"x":1,"y":null},"k2":{"x":2}},"l":[{"x":1,"z":""},{"x":2}]}`, want: `{"a":1,"d":null,"m":{"k1":{"x":1},"k2":{"x":2}},"l":[{"x":1},{"x":2}]}`},
		{in: `{"a":1,"d":null,"status":{"ready":true}}`, err: ".status (in T)"},
		{in: `{"a":1,"d":null,"l":[{"x":1},{"x":2,"y":[3]}]}`, err: ".l[1].y (in S)"},
	} {
		got, err := jsonForRelease([]byte(tc.in), "T", rt)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one naming %s", tc.in, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case string(got) != tc.want:
			t.Errorf("%s:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
	yamlIn := "a: 1\nstatus: {}\n"
	got, err := jsonForRelease([]byte(yamlIn), "T", rt)
	if err != nil || string(got) != "a: 1\nd: null\n" {
		t.Errorf("YAML %q: %q %v, want %q", yamlIn, got, err, "a: 1\nd: null\n")
	}
}
