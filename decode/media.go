package decode

import (
	"bytes"
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	sigsyaml "sigs.k8s.io/yaml"
)

var (
	protobufMagic = []byte("k8s\x00")
	cborSelfTag   = []byte{0xd9, 0xd9, 0xf7}
)

// MediaTypeOf detects how a plaintext value is serialized, as kube-apiserver's
// recognizing decoder would: the protobuf envelope magic, CBOR's self-described tag,
// or a JSON object.
func MediaTypeOf(plaintext []byte) (string, bool) {
	switch {
	case bytes.HasPrefix(plaintext, protobufMagic):
		return MediaTypeProtobuf, true
	case bytes.HasPrefix(plaintext, cborSelfTag):
		return MediaTypeCBOR, true
	}
	trimmed := bytes.TrimLeft(plaintext, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		return MediaTypeJSON, true
	}
	return "", false
}

// ShortMediaType names a media type for reports: protobuf, json, cbor.
func ShortMediaType(mt string) string {
	switch mt {
	case MediaTypeProtobuf:
		return "protobuf"
	case MediaTypeJSON:
		return "json"
	case MediaTypeCBOR:
		return "cbor"
	case MediaTypeYAML:
		return "yaml"
	}
	return mt
}

// StoredGVK reads the apiVersion/kind a value was stored with, without decoding the
// object: the runtime.Unknown typeMeta of a protobuf envelope, or the JSON (or YAML,
// for --storage-media-type=application/yaml) apiVersion/kind fields. CBOR is left to
// the custom-resource codec.
func StoredGVK(key string, plaintext []byte) (schema.GroupVersionKind, string, error) {
	mt, ok := MediaTypeOf(plaintext)
	if !ok {
		// kube-apiserver's storage decoder tries YAML last, for what no other
		// serializer recognises (YAML has no magic).
		if gvk, ok := yamlTypeMeta(plaintext); ok {
			return gvk, MediaTypeYAML, nil
		}
		return schema.GroupVersionKind{}, "", Errorf(key, ReasonCorruptPayload, nil, "not protobuf, JSON, YAML or CBOR (%d bytes)", len(plaintext))
	}
	switch mt {
	case MediaTypeProtobuf:
		body := plaintext[len(protobufMagic):]
		apiVersion, kind, err := envelopeTypeMeta(body)
		if err != nil {
			// Rare: let the generated (more lenient) unmarshaller have the last word.
			var u runtime.Unknown
			if uerr := u.Unmarshal(body); uerr != nil {
				return schema.GroupVersionKind{}, mt, Errorf(key, ReasonCorruptEnvelope, uerr, "protobuf envelope")
			}
			apiVersion, kind = u.APIVersion, u.Kind
		}
		if kind == "" {
			return schema.GroupVersionKind{}, mt, Errorf(key, ReasonCorruptEnvelope, nil, "protobuf envelope has no kind")
		}
		return schema.FromAPIVersionAndKind(apiVersion, kind), mt, nil
	case MediaTypeJSON:
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := json.Unmarshal(plaintext, &tm); err != nil {
			return schema.GroupVersionKind{}, mt, Errorf(key, ReasonCorruptPayload, nil, "invalid JSON: %s", jsonErrorSummary(err))
		}
		if tm.Kind == "" || tm.APIVersion == "" {
			return schema.GroupVersionKind{}, mt, Errorf(key, ReasonCorruptPayload, nil, "JSON object has no apiVersion/kind")
		}
		return schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind), mt, nil
	}
	return schema.GroupVersionKind{}, mt, nil
}

// yamlTypeMeta reads apiVersion and kind of a YAML mapping, as the apiserver's YAML
// serializer finds them (sigs.k8s.io/yaml, then JSON).
func yamlTypeMeta(plaintext []byte) (schema.GroupVersionKind, bool) {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := sigsyaml.Unmarshal(plaintext, &tm); err != nil || tm.Kind == "" || tm.APIVersion == "" {
		return schema.GroupVersionKind{}, false
	}
	return schema.FromAPIVersionAndKind(tm.APIVersion, tm.Kind), true
}

// envelopeTypeMeta reads typeMeta (field 1: apiVersion 1, kind 2) of the
// runtime.Unknown envelope and checks the wire format of the whole envelope,
// without copying the object's raw bytes as runtime.Unknown.Unmarshal does (a
// third of the bytes a scan allocated went there).
func envelopeTypeMeta(b []byte) (apiVersion, kind string, err error) {
	// typeMeta, raw, contentEncoding, contentType are all bytes fields.
	err = bytesFields(b, 4, func(num protowire.Number, v []byte) error {
		if num != 1 {
			return nil
		}
		return bytesFields(v, 2, func(num protowire.Number, v []byte) error {
			if num == 1 {
				apiVersion = string(v)
			} else {
				kind = string(v)
			}
			return nil
		})
	})
	return apiVersion, kind, err
}

// bytesFields walks the protobuf message b, checking its wire format, and
// calls fn with the value of each field numbered 1..last, which must be of the
// bytes wire type; other fields are skipped.
func bytesFields(b []byte, last protowire.Number, fn func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num < 1 || num > last {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		if typ != protowire.BytesType {
			return fmt.Errorf("field %d has wire type %d, want bytes", num, typ)
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		if err := fn(num, v); err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
		b = b[n:]
	}
	return nil
}

// jsonErrorSummary keeps JSON errors free of the value's content.
func jsonErrorSummary(err error) string {
	switch e := err.(type) {
	case *json.SyntaxError:
		return fmt.Sprintf("syntax error at offset %d", e.Offset)
	case *json.UnmarshalTypeError:
		return fmt.Sprintf("field %q has the wrong type", e.Field)
	}
	return "malformed"
}
