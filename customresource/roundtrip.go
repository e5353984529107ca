package customresource

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"kube-etcd-migrate/internal/jsondoc"
)

// LossError is returned by RoundTrip when rewriting the value would lose data. It names
// JSON paths only, never values.
type LossError struct {
	GVK schema.GroupVersionKind
	// Pruned are fields stored in etcd that the apiserver's read path drops: unknown to
	// the stored version's structural schema (pruning), non-nullable nulls without a
	// default, malformed or unknown metadata fields. The API never shows them, but they
	// are still in etcd; any rewrite (ours or the apiserver's) deletes them for good.
	Pruned []string
	// Changed are values the codec itself cannot carry: numbers that do not survive
	// int64/float64 (e.g. integers beyond 2^63), duplicate object keys (the last one
	// wins), invalid UTF-8, metadata the apiserver normalises (e.g. sub-second
	// timestamps), a CBOR value JSON cannot represent.
	Changed []string
}

func (e *LossError) Error() string {
	var parts []string
	if len(e.Pruned) > 0 {
		parts = append(parts, fmt.Sprintf("%d field(s) unknown to the schema of %s or malformed would be dropped: %s", len(e.Pruned), e.GVK.GroupVersion(), listPaths(e.Pruned)))
	}
	if len(e.Changed) > 0 {
		parts = append(parts, fmt.Sprintf("%d value(s) would change: %s", len(e.Changed), listPaths(e.Changed)))
	}
	return "rewriting " + e.GVK.Kind + " would lose data: " + strings.Join(parts, "; ")
}

func listPaths(p []string) string {
	const max = 10
	if len(p) <= max {
		return strings.Join(p, ", ")
	}
	return strings.Join(p[:max], ", ") + fmt.Sprintf(", ... (%d more)", len(p)-max)
}

// RoundTrip is the lose-fields guard. It decodes plaintext in the stored version
// without pruning or defaulting, re-serialises it as the apiserver would (its storage
// serializer: JSON, or CBOR with the CBORServingAndStorage gate on) and compares the two semantically: formatting the apiserver
// normalises on every write is not a loss — whitespace, key order, string escapes
// (\u00e9 vs é, HTML escaping of <>&), number spelling of the same value (1.0, 1e0, -0
// vs 1, 0) and CBOR vs JSON. Everything else is reported in a *LossError:
//
//   - Changed: values the JSON/CBOR codec alters (see LossError.Changed);
//   - Pruned: fields the apiserver's own read path drops (structural pruning unless
//     spec.preserveUnknownFields or x-kubernetes-preserve-unknown-fields covers them,
//     non-nullable nulls without default, malformed/unknown metadata). Empty metadata
//     fields (null, "", 0, {}, []) are not reported: ObjectMeta cannot tell them from
//     absent ones. Fields added on read (defaults, generation 1) are not losses.
//
// A kube-apiserver would lose the same data on its next write of the object; the caller
// decides whether Pruned alone may be accepted (errors.As(err, &lossErr)). Any other
// error means the value cannot be read at all.
func (c *Codec) RoundTrip(plaintext []byte) error {
	raw, info, err := c.decodeRaw(plaintext)
	if err != nil {
		return err
	}
	loss := &LossError{GVK: info.GVK}

	// 1. The codec: what a read of the re-encoded value would see, against a lossless
	// reading of the stored bytes. Re-encoded byte for byte as stored, it sees what
	// was stored: the encoder wrote each key once, valid UTF-8, and every number as
	// the stored literal, so the comparison below would find nothing.
	var buf bytes.Buffer
	if err := c.storage.Encode(raw, &buf); err != nil {
		return fmt.Errorf("%s: re-encoding: %w", info.GVK, err)
	}
	if !bytes.Equal(buf.Bytes(), plaintext) {
		if err := c.codecLosses(raw, info, plaintext, buf.Bytes(), loss); err != nil {
			return err
		}
	}

	// 2. The apiserver's read path (pruning, metadata coercion), without defaulting.
	coerced := raw.DeepCopy()
	if err := c.coerce(coerced, true, true); err != nil {
		return fmt.Errorf("%s: %w", info.GVK, err)
	}
	d := jsondoc.Diff(raw.Object, coerced.Object)
	loss.Pruned = append(loss.Pruned, d.Removed...)
	loss.Changed = append(loss.Changed, d.Changed...)

	loss.Pruned = dedupSorted(loss.Pruned)
	loss.Changed = dedupSorted(loss.Changed)
	if len(loss.Pruned) > 0 || len(loss.Changed) > 0 {
		return loss
	}
	return nil
}

// codecLosses adds to loss what the storage codec changes: re, raw re-encoded,
// read back, against a lossless reading of the stored plaintext.
func (c *Codec) codecLosses(raw *unstructured.Unstructured, info StoredInfo, plaintext, re []byte, loss *LossError) error {
	var err error
	var stored interface{}
	if info.MediaType == MediaTypeJSON {
		var dups []string
		stored, dups, err = jsondoc.Read(plaintext)
		if err != nil {
			return fmt.Errorf("%s: %w", info.GVK, err)
		}
		loss.Changed = append(loss.Changed, dups...)
		if !utf8.Valid(plaintext) {
			loss.Changed = append(loss.Changed, "(a string with invalid UTF-8)")
		}
	} else {
		// The apiserver's CBOR decoder is strict (no duplicate keys, no NaN/Inf, valid
		// UTF-8 text strings): what it decoded is what was stored.
		stored = raw.Object
	}
	var reread map[string]interface{}
	if c.mediaType == MediaTypeJSON {
		// The generic JSON reading (float64, int64), not the storage decoder's:
		// it tells a value changed by the encoder from one merely respelled.
		if err := utiljson.Unmarshal(re, &reread); err != nil {
			return fmt.Errorf("%s: re-encoded value does not decode: %w", info.GVK, err)
		}
	} else {
		u := &unstructured.Unstructured{}
		if _, _, err := c.storage.Decode(re, nil, u); err != nil {
			return fmt.Errorf("%s: re-encoded value does not decode: %w", info.GVK, sanitizeDecodeError(err))
		}
		reread = u.Object
	}
	d := jsondoc.Diff(stored, reread)
	loss.Changed = append(append(loss.Changed, d.Removed...), d.Changed...)
	return nil
}

func dedupSorted(s []string) []string {
	sort.Strings(s)
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
