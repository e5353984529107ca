package customresource

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
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
	diffValues("", raw.Object, coerced.Object, false, &loss.Pruned, &loss.Changed)

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
		stored, dups, err = losslessJSON(plaintext)
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
	diffValues("", stored, reread, false, &loss.Changed, &loss.Changed)
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

func childPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// diffValues records the paths where b (after) lost or changed something of a (before):
// keys of a missing in b go to removed, differing values to changed. Keys only in b are
// additions and ignored. Under metadata, zero values are not information.
func diffValues(path string, a, b interface{}, inMeta bool, removed, changed *[]string) {
	switch av := a.(type) {
	case map[string]interface{}:
		bv, ok := b.(map[string]interface{})
		if !ok {
			if !(inMeta && isZero(a)) {
				*changed = append(*changed, orRoot(path))
			}
			return
		}
		for k, ae := range av {
			p := childPath(path, k)
			meta := inMeta || p == "metadata"
			be, found := bv[k]
			if !found {
				if !(meta && isZero(ae)) {
					*removed = append(*removed, p)
				}
				continue
			}
			diffValues(p, ae, be, meta, removed, changed)
		}
	case []interface{}:
		bv, ok := b.([]interface{})
		if !ok || len(bv) != len(av) {
			if !(inMeta && isZero(a)) {
				*changed = append(*changed, orRoot(path))
			}
			return
		}
		for i := range av {
			diffValues(path+"["+strconv.Itoa(i)+"]", av[i], bv[i], inMeta, removed, changed)
		}
	default:
		if !scalarEqual(a, b) && !(inMeta && isZero(a)) {
			*changed = append(*changed, orRoot(path))
		}
	}
}

func orRoot(p string) string {
	if p == "" {
		return "(root)"
	}
	return p
}

func isZero(v interface{}) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case bool:
		return !x
	case map[string]interface{}:
		return len(x) == 0
	case []interface{}:
		return len(x) == 0
	}
	if r, ok := toRat(v); ok {
		return r.Sign() == 0
	}
	return false
}

func scalarEqual(a, b interface{}) bool {
	ra, aNum := toRat(a)
	rb, bNum := toRat(b)
	if aNum || bNum {
		return aNum && bNum && ra.Cmp(rb) == 0
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	}
	return false
}

// toRat gives the exact value of a JSON/CBOR number.
func toRat(v interface{}) (*big.Rat, bool) {
	switch x := v.(type) {
	case json.Number:
		r, ok := new(big.Rat).SetString(string(x))
		return r, ok
	case int64:
		return new(big.Rat).SetInt64(x), true
	case int:
		return new(big.Rat).SetInt64(int64(x)), true
	case int32:
		return new(big.Rat).SetInt64(int64(x)), true
	case uint64:
		return new(big.Rat).SetInt(new(big.Int).SetUint64(x)), true
	case float64:
		return floatRat(x, 64)
	case float32:
		return floatRat(float64(x), 32)
	}
	return nil, false
}

// floatRat is the value of a decoded float as an encoder writes it again:
// its shortest decimal spelling (what encoding/json and the CBOR encoder's
// float reading give back), not its exact binary value. A stored 0.1 is
// written back as 0.1; a stored 0.10000000000000000001, read as the same
// float, is not (its exact value differs).
func floatRat(x float64, bits int) (*big.Rat, bool) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil, true // never equal
	}
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(x, 'g', -1, bits))
	if !ok {
		return nil, true
	}
	return r, true
}

// losslessJSON parses one JSON value keeping number literals (json.Number) and
// reporting duplicate object keys (encoding/json keeps the last; so does this tree).
func losslessJSON(data []byte) (interface{}, []string, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var dups []string
	v, err := parseValue(dec, "", &dups, 0)
	if err != nil {
		return nil, nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, nil, errors.New("trailing data after the JSON object")
	}
	return v, dups, nil
}

const maxDepth = 10000 // encoding/json's own nesting limit

func parseValue(dec *json.Decoder, path string, dups *[]string, depth int) (interface{}, error) {
	if depth > maxDepth {
		return nil, errors.New("JSON nested too deeply")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := map[string]interface{}{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, errors.New("malformed JSON object key")
				}
				p := childPath(path, k)
				v, err := parseValue(dec, p, dups, depth+1)
				if err != nil {
					return nil, err
				}
				if _, seen := m[k]; seen {
					*dups = append(*dups, p+" (duplicate key)")
				}
				m[k] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return m, nil
		case '[':
			var a []interface{}
			for i := 0; dec.More(); i++ {
				v, err := parseValue(dec, path+"["+strconv.Itoa(i)+"]", dups, depth+1)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			if a == nil {
				a = []interface{}{}
			}
			return a, nil
		}
		return nil, errors.New("malformed JSON")
	default:
		return t, nil
	}
}
