package reencode

import (
	"bytes"
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/release"
)

// jsonForRelease is forRelease for an object kube-apiserver's JSON or YAML
// serializer wrote (--storage-media-type=application/json or yaml): each
// object member as the target release's types write it (releasegen's
// JSON fields of that release): in their order, with the zero values they
// write and this release's types leave out (1.34's ResourceSlice
// "devices":null), without the zero-valued members they do not have (1.37's
// CSINode "status":{}, a struct encoding/json never omits); a member they do
// not have holding a value is an error. A value with nothing to change is
// returned as it is.
func jsonForRelease(data []byte, typ string, rt release.Types) ([]byte, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	isJSON := len(trimmed) > 0 && trimmed[0] == '{'
	doc := data
	if !isJSON {
		// kube-apiserver's YAML is its JSON through sigs.k8s.io/yaml's
		// JSONToYAML (keys sorted): written as JSON, then converted the
		// same way.
		j, err := yaml.YAMLToJSON(data)
		if err != nil {
			return nil, fmt.Errorf("not a YAML object: %v", err)
		}
		doc = j
	}
	body := bytes.TrimRight(doc, " \t\r\n")
	out, changed, err := releaseJSON(body, typ, rt, "", 0)
	if err != nil {
		return nil, err
	}
	if !changed {
		return data, nil
	}
	if !isJSON {
		return yaml.JSONToYAML(out)
	}
	return append(out, doc[len(body):]...), nil
}

// releaseJSON writes the JSON object b, of type typ, as the release's type
// writes it; changed says whether that differs from b. An error names a
// member the type has not that holds a value (its path).
func releaseJSON(b []byte, typ string, rt release.Types, path string, depth int) ([]byte, bool, error) {
	fields, ok := rt.JSON[typ]
	if !ok || depth > maxWireDepth {
		return b, false, nil
	}
	members, ok := jsonMembers(b)
	if !ok {
		return b, false, nil
	}
	names := make([]string, len(members))
	for i, m := range members {
		if err := json.Unmarshal(m.key, &names[i]); err != nil {
			return b, false, nil
		}
	}
	var out [][]byte
	member := func(key, val []byte) { out = append(out, append(append(append([]byte{}, key...), ':'), val...)) }
	if len(fields) == 1 && fields[0].Name == "*" { // a map's values
		if fields[0].Type == "" {
			return b, false, nil
		}
		for i, m := range members {
			val, _, err := releaseJSONValue(m.val, fields[0].Type, rt, path+"."+names[i], depth+1)
			if err != nil {
				return nil, false, err
			}
			member(m.key, val)
		}
	} else {
		index := make(map[string]int, len(members))
		for i, name := range names {
			index[name] = i
		}
		used := make([]bool, len(members))
		for _, f := range fields {
			i, ok := index[f.Name]
			if !ok {
				if f.Zero != "" {
					key, _ := json.Marshal(f.Name)
					member(key, []byte(f.Zero))
				}
				continue
			}
			used[i] = true
			val := members[i].val
			if f.Type != "" {
				v, _, err := releaseJSONValue(val, f.Type, rt, path+"."+f.Name, depth+1)
				if err != nil {
					return nil, false, err
				}
				val = v
			}
			member(members[i].key, val)
		}
		for i, m := range members {
			if !used[i] && !jsonZero(m.val, depth+1) {
				return nil, false, fmt.Errorf("%s.%s (in %s)", path, names[i], typ)
			}
		}
	}
	res := append([]byte{'{'}, bytes.Join(out, []byte{','})...)
	res = append(res, '}')
	if bytes.Equal(res, b) {
		return b, false, nil
	}
	return res, true, nil
}

// releaseJSONValue is releaseJSON for an object of type typ, or each object
// of an array of them.
func releaseJSONValue(v []byte, typ string, rt release.Types, path string, depth int) ([]byte, bool, error) {
	if len(v) == 0 {
		return v, false, nil
	}
	switch v[0] {
	case '{':
		return releaseJSON(v, typ, rt, path, depth)
	case '[':
		elems, ok := jsonElements(v)
		if !ok {
			return v, false, nil
		}
		changed := false
		out := make([][]byte, len(elems))
		for i, e := range elems {
			p, c, err := releaseJSONValue(e, typ, rt, fmt.Sprintf("%s[%d]", path, i), depth+1)
			if err != nil {
				return nil, false, err
			}
			out[i], changed = p, changed || c
		}
		if !changed {
			return v, false, nil
		}
		return append(append([]byte{'['}, bytes.Join(out, []byte{','})...), ']'), true, nil
	}
	return v, false, nil
}

// jsonZero reports whether the JSON value v is what encoding/json writes
// for a zero value: null, false, 0, "", [] or {}, or an object of such.
func jsonZero(v []byte, depth int) bool {
	switch string(v) {
	case "null", "false", "0", `""`, "[]", "{}":
		return true
	}
	if len(v) == 0 || v[0] != '{' || depth > maxWireDepth {
		return false
	}
	members, ok := jsonMembers(v)
	if !ok {
		return false
	}
	for _, m := range members {
		if !jsonZero(m.val, depth+1) {
			return false
		}
	}
	return true
}

// jsonMember is one member of a JSON object: its key (quoted, as written)
// and its value's bytes.
type jsonMember struct{ key, val []byte }

// jsonMembers splits the JSON object b into its members, in order; false if
// b is not one well-formed object.
func jsonMembers(b []byte) ([]jsonMember, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	var out []jsonMember
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return out, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		kEnd := endOfValue(b, i)
		if kEnd < 0 {
			return nil, false
		}
		key := b[i:kEnd]
		i = skipSpace(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		i = skipSpace(b, i+1)
		vEnd := endOfValue(b, i)
		if vEnd < 0 {
			return nil, false
		}
		out = append(out, jsonMember{key: key, val: b[i:vEnd]})
		i = skipSpace(b, vEnd)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return out, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// jsonElements splits the JSON array b into its elements; false if b is not
// one well-formed array.
func jsonElements(b []byte) ([][]byte, bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, false
	}
	var out [][]byte
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return out, skipSpace(b, i+1) == len(b)
	}
	for {
		end := endOfValue(b, i)
		if end < 0 {
			return nil, false
		}
		out = append(out, b[i:end])
		i = skipSpace(b, end)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == ']':
			return out, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// endOfValue returns the index just past the JSON value starting at b[i],
// or -1 if there is none: a string to its closing quote, an object or array
// to its closing bracket (strings inside skipped), anything else (numbers,
// true, false, null) to the next delimiter. The value's own syntax is
// json.Valid's concern: the caller's bytes are a serializer's.
func endOfValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1
			}
		}
		return -1
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := endOfValue(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && !bytes.ContainsRune([]byte(",}] \t\r\n"), rune(b[j])) {
		j++
	}
	if j == i {
		return -1
	}
	return j
}
