package decode

import (
	"bytes"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
	case "application/yaml":
		return "yaml"
	}
	return mt
}

// StoredGVK reads the apiVersion/kind a value was stored with, without decoding the
// object: the runtime.Unknown typeMeta of a protobuf envelope, or the JSON
// apiVersion/kind fields. CBOR is left to the custom-resource codec.
func StoredGVK(key string, plaintext []byte) (schema.GroupVersionKind, string, error) {
	mt, ok := MediaTypeOf(plaintext)
	if !ok {
		return schema.GroupVersionKind{}, "", Errorf(key, ReasonCorruptPayload, nil, "not protobuf, JSON or CBOR (%d bytes)", len(plaintext))
	}
	switch mt {
	case MediaTypeProtobuf:
		var u runtime.Unknown
		if err := u.Unmarshal(plaintext[len(protobufMagic):]); err != nil {
			return schema.GroupVersionKind{}, mt, Errorf(key, ReasonCorruptEnvelope, err, "protobuf envelope")
		}
		if u.Kind == "" {
			return schema.GroupVersionKind{}, mt, Errorf(key, ReasonCorruptEnvelope, nil, "protobuf envelope has no kind")
		}
		return schema.FromAPIVersionAndKind(u.APIVersion, u.Kind), mt, nil
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
