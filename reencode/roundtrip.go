package reencode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	sigsyaml "sigs.k8s.io/yaml"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/jsondoc"
	"kube-etcd-migrate/release"
)

// RoundTrip is the lose-fields guard for built-ins: decode the stored value in its
// stored version with no conversion and no defaulting, serialize it again with the
// same serializer, and compare. Protobuf is compared byte for byte (the generated
// marshallers are deterministic, and silently drop fields they do not know); JSON is
// compared as a document, since other writers may order keys differently. The
// decoded object is the one the decode kept (decode.Object.Versioned), when it
// did.
func RoundTrip(obj *decode.Object) error {
	rc := obj.Codec
	if rc == nil {
		return fmt.Errorf("no codec for %s", obj.Info.Resource)
	}
	var versioned runtime.Object
	var gvk *schema.GroupVersionKind
	if v := obj.Versioned; v != nil {
		// What the storage codec's serializer decoded, kept by the decode:
		// what decoding once more would give.
		versioned, gvk = v.Object, &v.GVK
	} else {
		var err error
		if versioned, gvk, err = rc.Codecs.UniversalDeserializer().Decode(obj.Plaintext, nil, nil); err != nil {
			return fmt.Errorf("decode %s without conversion: %w", obj.StoredGVK, err)
		}
	}
	versioned.GetObjectKind().SetGroupVersionKind(*gvk)
	switch obj.MediaType {
	case decode.MediaTypeProtobuf:
		var buf bytes.Buffer
		if err := protobuf.NewSerializer(rc.Scheme, rc.Scheme).Encode(versioned, &buf); err != nil {
			return fmt.Errorf("re-encode %s: %w", gvk, err)
		}
		// Byte for byte, or every stored field kept and only zero values
		// added (what a newer release's types write for fields an older
		// one did not have): see wireKeeps.
		re, stored := buf.Bytes(), obj.Plaintext
		if bytes.Equal(re, stored) {
			return nil
		}
		if len(re) < len(protobufMagic) || len(stored) < len(protobufMagic) || !bytes.Equal(re[:len(protobufMagic)], stored[:len(protobufMagic)]) ||
			!wireKeeps(stored[len(protobufMagic):], re[len(protobufMagic):], 0) {
			return fmt.Errorf("the %s types of Kubernetes %s do not give back every field of the stored protobuf (%d bytes stored, %d re-encoded): it was probably written by a newer release with fields these types would drop", gvk, release.Linked(), len(stored), len(re))
		}
		return nil
	case decode.MediaTypeJSON, decode.MediaTypeYAML:
		re, err := json.Marshal(versioned)
		if err != nil {
			return fmt.Errorf("re-encode %s: %w", gvk, err)
		}
		stored := obj.Plaintext
		if obj.MediaType == decode.MediaTypeYAML {
			// The apiserver's YAML serializer is its JSON one through sigs.k8s.io/yaml.
			if stored, err = sigsyaml.YAMLToJSON(stored); err != nil {
				return fmt.Errorf("stored YAML: %w", err)
			}
		}
		// Fast path: kube-apiserver's JSON serializer writes what
		// json.Marshal does, plus a newline; identical bytes lose nothing.
		if bytes.Equal(re, bytes.TrimSuffix(stored, []byte("\n"))) {
			return nil
		}
		a, _, err := jsondoc.Read(stored)
		if err != nil {
			return fmt.Errorf("stored JSON: %w", err)
		}
		b, _, err := jsondoc.Read(re)
		if err != nil {
			return err
		}
		// Every stored member kept, or only empty ones dropped (null, [],
		// {}: what an older release's types write where this release's
		// leave the member out, 1.34's ResourceSlice "devices":null), and
		// only zero values added (what this release's types write for a
		// member an older release's did not have, 1.37's CSINode
		// "status":{}), as wireKeeps for protobuf.
		if !reflect.DeepEqual(a, b) && !jsonKeeps(a, b, 0) {
			return fmt.Errorf("the %s types of Kubernetes %s do not give back the stored JSON document: fields %s would be lost or changed", gvk, release.Linked(), lostPaths(a, b))
		}
		return nil
	}
	return fmt.Errorf("unexpected media type %q for a built-in resource", obj.MediaType)
}

// protobufMagic prefixes kube-apiserver's protobuf encoding (k8s.io/apimachinery's
// protobuf serializer), before the runtime.Unknown envelope.
var protobufMagic = []byte{0x6b, 0x38, 0x73, 0x00}

// jsonKeeps reports whether the decoded JSON value b (re-encoded) keeps
// everything of a (stored): the same scalars, arrays of the same length
// whose elements keep, objects whose members keep, where a member only a
// has is empty (null, [], {}) and a member only b has is a zero value.
func jsonKeeps(a, b any, depth int) bool {
	if depth > maxWireDepth {
		return reflect.DeepEqual(a, b)
	}
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok {
			return false
		}
		for k, av := range x {
			bv, ok := y[k]
			if !ok {
				if !jsonEmptyValue(av) {
					return false
				}
				continue
			}
			if !jsonKeeps(av, bv, depth+1) {
				return false
			}
		}
		for k, bv := range y {
			if _, ok := x[k]; !ok && !jsonZeroValue(bv, depth+1) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonKeeps(x[i], y[i], depth+1) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// jsonEmptyValue: null, [] or {}.
func jsonEmptyValue(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// jsonZeroValue: what encoding/json writes for a zero value (null, false,
// 0, "", [], {}), or an object of such.
func jsonZeroValue(v any, depth int) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case string:
		return x == ""
	case json.Number:
		f, err := x.Float64()
		return err == nil && f == 0
	case []any:
		return len(x) == 0
	case map[string]any:
		if depth > maxWireDepth {
			return false
		}
		for _, e := range x {
			if !jsonZeroValue(e, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// lostPaths names the first five paths (in order, as jq writes them:
// ".status", "." the whole document) where the re-encoded document b
// differs from the stored a.
func lostPaths(a, b any) string {
	d := jsondoc.Diff(a, b)
	paths := slices.Concat(d.Removed, d.Changed, d.Added)
	if len(paths) == 0 {
		// jsonKeeps compares numbers as spelled and metadata's zero values
		// as values; Diff by value and without them.
		return "(none by value: a number or a zero value of metadata spelled otherwise)"
	}
	slices.Sort(paths)
	paths = paths[:min(len(paths), 5)]
	for i, p := range paths {
		if p == "(root)" {
			p = ""
		}
		paths[i] = "." + p
	}
	return strings.Join(paths, ", ")
}
