// Package jsondoc compares a JSON document as stored with the same document
// re-encoded, for the round-trip checks that refuse a rewrite which would
// lose data (reencode's of built-ins, customresource's of custom resources):
// the stored bytes read losslessly (Read: number literals kept, duplicate
// keys reported), the two documents compared by value (numbers by the exact
// value an encoder writes again, not by their spelling) and the paths where
// the re-encoded one lost, changed or added something (Diff). It names JSON
// paths only, never values.
package jsondoc

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/big"
	"strconv"
)

func childPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Paths are where a document (after) differs from another (before), as Diff
// finds them: "spec.x", "items[2]", "(root)".
type Paths struct {
	// Removed are members of before that after lacks.
	Removed []string
	// Changed are values after changed: a scalar of another value, an object
	// or array of another kind or length.
	Changed []string
	// Added are members only after has.
	Added []string
}

// Diff is where after (a document re-encoded and read again) lost, changed
// or added something of before (the stored one), both as Read or
// encoding/json read them. Numbers are compared by value; under metadata,
// zero values (null, "", 0, false, {}, []) are not information (ObjectMeta
// cannot tell them from absent ones).
func Diff(before, after any) Paths {
	var p Paths
	diffValues("", before, after, false, &p)
	return p
}

// diffValues records in p the paths where b (after) lost, changed or added
// something of a (before).
func diffValues(path string, a, b interface{}, inMeta bool, p *Paths) {
	switch av := a.(type) {
	case map[string]interface{}:
		bv, ok := b.(map[string]interface{})
		if !ok {
			if !(inMeta && isZero(a)) {
				p.Changed = append(p.Changed, orRoot(path))
			}
			return
		}
		for k, ae := range av {
			c := childPath(path, k)
			meta := inMeta || c == "metadata"
			be, found := bv[k]
			if !found {
				if !(meta && isZero(ae)) {
					p.Removed = append(p.Removed, c)
				}
				continue
			}
			diffValues(c, ae, be, meta, p)
		}
		for k, be := range bv {
			c := childPath(path, k)
			if _, found := av[k]; !found && !((inMeta || c == "metadata") && isZero(be)) {
				p.Added = append(p.Added, c)
			}
		}
	case []interface{}:
		bv, ok := b.([]interface{})
		if !ok || len(bv) != len(av) {
			if !(inMeta && isZero(a)) {
				p.Changed = append(p.Changed, orRoot(path))
			}
			return
		}
		for i := range av {
			diffValues(path+"["+strconv.Itoa(i)+"]", av[i], bv[i], inMeta, p)
		}
	default:
		if !scalarEqual(a, b) && !(inMeta && isZero(a)) {
			p.Changed = append(p.Changed, orRoot(path))
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

// Read parses one JSON value keeping number literals (json.Number) and
// reporting the paths of duplicate object keys (encoding/json keeps the last;
// so does this tree).
func Read(data []byte) (interface{}, []string, error) {
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
