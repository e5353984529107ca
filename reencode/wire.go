package reencode

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/release"
)

// wireField is one field of a protobuf message as it is on the wire.
type wireField struct {
	num protowire.Number
	typ protowire.Type
	val []byte // the value's bytes: varint or fixed as encoded, the payload of a length-delimited field
	u   uint64 // a varint's value
	raw []byte // the whole field: tag and value
}

// wireFields splits a protobuf message into its fields, in wire order; false
// if b is not a well-formed message (groups are not: Kubernetes' types have none).
func wireFields(b []byte) ([]wireField, bool) {
	var out []wireField
	for len(b) > 0 {
		start := b
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		f := wireField{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(b)
			if n >= 0 {
				f.val = b[:n]
			}
		case protowire.Fixed32Type:
			_, n = protowire.ConsumeFixed32(b)
			if n >= 0 {
				f.val = b[:n]
			}
		case protowire.Fixed64Type:
			_, n = protowire.ConsumeFixed64(b)
			if n >= 0 {
				f.val = b[:n]
			}
		case protowire.BytesType:
			f.val, n = protowire.ConsumeBytes(b)
		default:
			return nil, false
		}
		if n < 0 {
			return nil, false
		}
		b = b[n:]
		f.raw = start[:len(start)-len(b)]
		out = append(out, f)
	}
	return out, true
}

// maxWireDepth bounds the recursion into nested messages (Kubernetes objects
// nest a few dozen levels at most).
const maxWireDepth = 100

// wireKeeps reports whether re, the re-encoding of the protobuf message
// stored, keeps everything stored holds: every field of stored is in re, in
// the same order, with the same value or (a nested message) a value that
// keeps it in turn, and every other field of re is a zero value (a number 0,
// an empty string or message, or a message of only such fields).
//
// The Go types of a newer release write some fields the older release's
// types never wrote, even when empty: a new non-pointer message field, as
// CSINode's status in 1.37, is always marshalled, so an object an older
// kube-apiserver stored re-encodes to more bytes without losing anything.
// A field the types do not know is dropped by their unmarshaller: it is in
// stored and not in re, which this reports.
func wireKeeps(stored, re []byte, depth int) bool {
	if bytes.Equal(stored, re) {
		return true
	}
	if depth > maxWireDepth {
		return false
	}
	sf, ok := wireFields(stored)
	if !ok {
		return false
	}
	rf, ok := wireFields(re)
	if !ok {
		return false
	}
	i := 0
	for _, r := range rf {
		if i < len(sf) && sf[i].num == r.num && sf[i].typ == r.typ &&
			(bytes.Equal(sf[i].val, r.val) || r.typ == protowire.BytesType && wireKeeps(sf[i].val, r.val, depth+1)) {
			i++
			continue
		}
		if !wireZero(r, depth+1) {
			return false
		}
	}
	return i == len(sf)
}

// wireZero reports whether f holds a zero value: what a type marshals for a
// field it was not given.
func wireZero(f wireField, depth int) bool {
	switch f.typ {
	case protowire.VarintType:
		return f.u == 0
	case protowire.Fixed32Type, protowire.Fixed64Type:
		return bytes.Count(f.val, []byte{0}) == len(f.val)
	case protowire.BytesType:
		if len(f.val) == 0 {
			return true
		}
		if depth > maxWireDepth {
			return false
		}
		fields, ok := wireFields(f.val)
		if !ok {
			return false
		}
		for _, g := range fields {
			if !wireZero(g, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// forRelease gives data, an object of kind gvk as this release's storage
// serializer encodes it (protobuf, JSON or YAML), as the types of the older
// release sc targets encode it, when that release's types were generated
// (releasegen): the fields its types do not have are left out. A newer release's types
// marshal some fields even when empty (1.37's CSINode status, a
// non-pointer message), which the older release never writes; the bytes
// must be the older release's so that its kube-apiserver finds them
// current. Such a field that holds a value would be lost by that release:
// an error.
func forRelease(sc *decode.StorageConfig, gvk schema.GroupVersionKind, data []byte) ([]byte, error) {
	rt, ok := sc.ReleaseTypes()
	if !ok {
		return data, nil
	}
	typ, ok := rt.Kinds[gvk.String()]
	if !ok {
		return data, nil
	}
	if !bytes.HasPrefix(data, protobufMagic) {
		out, err := jsonForRelease(data, typ, rt)
		if err != nil {
			return nil, fmt.Errorf("the types of kube-apiserver %s have no field %s of %s, which holds a value it would drop", rt.Release, err, gvk.Kind)
		}
		return out, nil
	}
	envelope, ok := wireFields(data[len(protobufMagic):])
	if !ok {
		return nil, fmt.Errorf("encode %s: not a protobuf envelope", gvk)
	}
	out := append(make([]byte, 0, len(data)), protobufMagic...)
	for _, f := range envelope {
		if f.num != 2 || f.typ != protowire.BytesType { // runtime.Unknown's raw
			out = append(out, f.raw...)
			continue
		}
		raw, err := pruneFields(f.val, typ, rt, "", 0)
		if err != nil {
			return nil, fmt.Errorf("the types of kube-apiserver %s have no field %s of %s, which holds a value it would drop", rt.Release, err, gvk.Kind)
		}
		out = protowire.AppendTag(out, 2, protowire.BytesType)
		out = protowire.AppendBytes(out, raw)
	}
	return out, nil
}

// pruneFields leaves out of message b, of type typ, the zero-valued fields
// the release's type has not; an error names a set one (its path of field
// numbers).
func pruneFields(b []byte, typ string, rt release.Types, path string, depth int) ([]byte, error) {
	fields, ok := rt.Types[typ]
	if !ok || depth > maxWireDepth {
		return b, nil
	}
	wf, ok := wireFields(b)
	if !ok {
		return b, nil
	}
	out := make([]byte, 0, len(b))
	for _, f := range wf {
		p := fmt.Sprintf("%s.%d", path, f.num)
		child, known := fields[int32(f.num)]
		switch {
		case !known && wireZero(f, depth+1):
		case !known:
			return nil, fmt.Errorf("%s (in %s)", p, typ)
		case child != "" && f.typ == protowire.BytesType:
			v, err := pruneFields(f.val, child, rt, p, depth+1)
			if err != nil {
				return nil, err
			}
			out = protowire.AppendTag(out, f.num, f.typ)
			out = protowire.AppendBytes(out, v)
		default:
			out = append(out, f.raw...)
		}
	}
	return out, nil
}
