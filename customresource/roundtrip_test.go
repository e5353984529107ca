package customresource

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

const canonicalWidget = `{"apiVersion":"stable.example.com/v1beta1","kind":"Widget","metadata":{"creationTimestamp":"2025-01-02T03:04:05Z","generation":1,"name":"w1","namespace":"default","uid":"6f1c1d3e-8f59-4d53-9a3c-3f0b4f6e2a11"},"spec":{"color":"\u003cred\u003e","ratio":0.5,"size":2}}` + "\n"

func TestRoundTripAcceptsCanonicalAndFormatting(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", true), Options{})
	for name, v := range map[string]string{
		"canonical": canonicalWidget,
		// Same data, spelled differently: the apiserver normalises all of this on write.
		"formatting": `{
		  "kind": "Widget", "apiVersion": "stable.example.com/v1beta1",
		  "spec": {"size": 2.0, "ratio": 5e-1, "color": "<red>"},
		  "metadata": {"name": "w1", "namespace": "default", "generation": 1,
		    "uid": "6f1c1d3e-8f59-4d53-9a3c-3f0b4f6e2a11", "creationTimestamp": "2025-01-02T03:04:05Z",
		    "labels": {}, "finalizers": []}
		}`,
		// Missing defaulted fields and generation are additions, not losses.
		"needs defaults": `{"apiVersion":"stable.example.com/v1beta1","kind":"Widget","metadata":{"name":"w1"},"spec":{}}`,
	} {
		if err := c.RoundTrip([]byte(v)); err != nil {
			t.Errorf("%s: RoundTrip = %v", name, err)
		}
	}
}

func TestRoundTripFlagsLosses(t *testing.T) {
	pruning := mustCodec(t, widgetCRD("v1", false), Options{})
	crd := widgetCRD("v1", false)
	crd.Spec.PreserveUnknownFields = true
	preserving := mustCodec(t, crd, Options{})

	unknownField := strings.Replace(canonicalWidget, `"size":2}`, `"size":2,"secretExtra":"s3cr3t"}`, 1)
	cases := []struct {
		name          string
		codec         *Codec
		value         string
		pruned, chngd []string
	}{
		// Behaviour: a field unknown to a pruning schema is reported (the apiserver hides
		// it and a rewrite deletes it from etcd); with preserveUnknownFields it is kept.
		{"unknown field, pruning schema", pruning, unknownField, []string{"spec.secretExtra"}, nil},
		{"unknown field, preserveUnknownFields", preserving, unknownField, nil, nil},
		{"unknown field under x-kubernetes-preserve-unknown-fields", pruning,
			strings.Replace(canonicalWidget, `"size":2}`, `"size":2,"free":{"x":{"y":1}}}`, 1), nil, nil},
		{"unknown metadata field", pruning,
			strings.Replace(canonicalWidget, `"name":"w1"`, `"name":"w1","futureField":"x"`, 1), []string{"metadata.futureField"}, nil},
		{"decimal beyond float64", pruning,
			strings.Replace(canonicalWidget, `"ratio":0.5`, `"ratio":0.10000000000000000001`, 1), nil, []string{"spec.ratio"}},
		{"decimal written back as stored", pruning,
			strings.Replace(canonicalWidget, `"ratio":0.5`, `"ratio":0.1`, 1), nil, nil},
		{"integer beyond int64", pruning,
			strings.Replace(canonicalWidget, `"size":2}`, `"size":2,"big":12345678901234567890}`, 1), nil, []string{"spec.big"}},
		{"duplicate key", pruning,
			strings.Replace(canonicalWidget, `"size":2}`, `"size":2,"size":3}`, 1), nil, []string{"spec.size (duplicate key)"}},
		{"sub-second timestamp", pruning,
			strings.Replace(canonicalWidget, `03:04:05Z`, `03:04:05.250Z`, 1), nil, []string{"metadata.creationTimestamp"}},
		{"invalid UTF-8", pruning,
			strings.Replace(canonicalWidget, `\u003cred\u003e`, "r\xffd", 1), nil, []string{"(a string with invalid UTF-8)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.codec.RoundTrip([]byte(tc.value))
			if tc.pruned == nil && tc.chngd == nil {
				if err != nil {
					t.Fatalf("RoundTrip = %v, want nil", err)
				}
				return
			}
			var le *LossError
			if !errors.As(err, &le) {
				t.Fatalf("RoundTrip = %v, want *LossError", err)
			}
			if !reflect.DeepEqual(le.Pruned, tc.pruned) || !reflect.DeepEqual(le.Changed, tc.chngd) {
				t.Fatalf("LossError pruned=%q changed=%q, want %q %q", le.Pruned, le.Changed, tc.pruned, tc.chngd)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("error quotes a stored value: %v", err)
			}
		})
	}
}

func TestGarbageIsAnErrorNotAPanic(t *testing.T) {
	c := mustCodec(t, widgetCRD("v1", true), Options{})
	inputs := []string{
		"", "null", "[]", "42", `"x"`, "{", canonicalWidget[:len(canonicalWidget)/2],
		`{"apiVersion":"stable.example.com/v1beta1","kind":"Widget","metadata":"nope"}`,
		`{"apiVersion":"stable.example.com/v1beta1","kind":"Widget","metadata":{"name":"w"},"spec":"str"}`,
		`{"apiVersion":7,"kind":"Widget","metadata":{}}`,
		`{"apiVersion":"a/b/c","kind":"Widget","metadata":{}}`,
		canonicalWidget + "trailing",
		"\xd9\xd9\xf7", "\xd9\xd9\xf7\xa1", "\xd9\xd9\xf7\xa1\x61\x61\x61",
		"\x6b\x38\x73\x00garbage",
	}
	for _, in := range inputs {
		if _, _, err := c.Decode([]byte(in)); err == nil {
			if in == `{"apiVersion":"stable.example.com/v1beta1","kind":"Widget","metadata":{"name":"w"},"spec":"str"}` {
				continue // pruning/defaulting accept a mistyped spec as the apiserver does
			}
			t.Errorf("Decode(%q) accepted", in)
		}
		if err := c.RoundTrip([]byte(in)); err == nil {
			t.Errorf("RoundTrip(%q) accepted", in)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(canonicalWidget))
	f.Add([]byte(`{"apiVersion":"stable.example.com/v1","kind":"Widget","metadata":{"name":"a","labels":{"x":1}},"spec":{"free":{"a":[1,2,{"b":null}]},"size":null}}`))
	f.Add([]byte(`{"apiVersion":"stable.example.com/v1beta1","kind":"Widget","metadata":{"name":"a","managedFields":[{"manager":"m","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{}}}]},"spec":{"oldName":"x"}}`))
	f.Add([]byte("\xd9\xd9\xf7\xa3\x64kind\x66Widget\x6aapiVersion\x75stable.example.com/v1\x68metadata\xa0"))
	f.Add([]byte(`{"items":[]}`))
	f.Add([]byte{})
	c, err := NewCodec(widgetCRD("v1", true), Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		u, _, err := c.Decode(data)
		_ = c.RoundTrip(data)
		if err != nil {
			return
		}
		out, err := c.Encode(context.Background(), u)
		if err != nil {
			return
		}
		// What we write must read back, and is then stable (already in the storage version).
		u2, _, err := c.Decode(out)
		if err != nil {
			t.Fatalf("Encode output does not decode: %v\n%s", err, out)
		}
		out2, err := c.Encode(context.Background(), u2)
		if err != nil {
			t.Fatalf("re-Encode: %v", err)
		}
		if string(out2) != string(out) {
			t.Fatalf("not stable:\n%s\n%s", out, out2)
		}
	})
}
