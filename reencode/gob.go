package reencode

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A run keeps batches of stale decisions on disk while its writes wait (the
// first write's wait, a compaction's: package guard's Spool and Backlog, with
// encoding/gob). A Decision encodes itself for them: its fields in one fixed
// order, lengths and numbers as varints, so that gob's reflection runs once
// a decision instead of once a field (it took a seventh of a key rotation's
// CPU). Err is not kept: a decision with one (an unreadable key) is never
// written, and GobEncode refuses it. The encoding lives and dies with the
// process (the files are unlinked at once): it has no version.

// GobEncode encodes d (gob.GobEncoder).
func (d *Decision) GobEncode() ([]byte, error) {
	if d.Err != nil {
		return nil, fmt.Errorf("%s: a decision with an error (%s) is not kept on disk", d.Key, d.Err.Reason)
	}
	n := 96 + len(d.Key) + len(d.Resource.Group) + len(d.Resource.Resource) + len(d.Status) +
		len(d.From.Version) + len(d.From.MediaType) + len(d.From.Encryption) +
		len(d.To.Version) + len(d.To.MediaType) + len(d.To.Encryption) + len(d.OldValue) + len(d.NewValue)
	for _, r := range d.Reasons {
		n += len(r) + 2
	}
	for _, s := range d.Dropped {
		n += len(s) + 2
	}
	b := make([]byte, 0, n)
	for _, s := range []string{d.Key, d.Resource.Group, d.Resource.Resource, string(d.Status),
		d.From.Version, d.From.MediaType, d.From.Encryption, d.To.Version, d.To.MediaType, d.To.Encryption} {
		b = appendBytes(b, []byte(s))
	}
	b = appendCount(b, d.Reasons == nil, len(d.Reasons))
	for _, r := range d.Reasons {
		b = appendBytes(b, []byte(r))
	}
	b = appendCount(b, d.Dropped == nil, len(d.Dropped))
	for _, s := range d.Dropped {
		b = appendBytes(b, []byte(s))
	}
	for _, v := range []int64{d.ModRevision, d.Lease, d.Read.ModSub, d.Read.CreateRevision, d.Read.Version, d.Read.Lease, int64(d.OldSize)} {
		b = binary.AppendVarint(b, v)
	}
	b = appendCount(b, d.OldValue == nil, len(d.OldValue))
	b = append(b, d.OldValue...)
	b = appendCount(b, d.NewValue == nil, len(d.NewValue))
	b = append(b, d.NewValue...)
	return b, nil
}

// GobDecode decodes what GobEncode encoded into d (gob.GobDecoder); d's
// values are copies of data's bytes.
func (d *Decision) GobDecode(data []byte) error {
	r := decisionReader{b: data}
	*d = Decision{}
	str := func() string { return string(r.bytes()) }
	d.Key, d.Resource.Group, d.Resource.Resource, d.Status = str(), str(), str(), Status(str())
	d.From = Form{Version: str(), MediaType: str(), Encryption: str()}
	d.To = Form{Version: str(), MediaType: str(), Encryption: str()}
	if n, ok := r.count(); ok {
		d.Reasons = make([]Reason, n)
		for i := range d.Reasons {
			d.Reasons[i] = Reason(r.bytes())
		}
	}
	if n, ok := r.count(); ok {
		d.Dropped = make([]string, n)
		for i := range d.Dropped {
			d.Dropped[i] = string(r.bytes())
		}
	}
	var oldSize int64
	for _, p := range []*int64{&d.ModRevision, &d.Lease, &d.Read.ModSub, &d.Read.CreateRevision, &d.Read.Version, &d.Read.Lease, &oldSize} {
		*p = r.varint()
	}
	d.OldSize = int(oldSize)
	d.OldValue = r.value()
	d.NewValue = r.value()
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes after the decision", len(r.b))
	}
	if r.err != nil {
		return fmt.Errorf("a decision kept on disk does not read back: %w", r.err)
	}
	return nil
}

// appendBytes appends p, its length first.
func appendBytes(b, p []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(p))), p...)
}

// appendCount appends a slice's length, 0 for a nil slice (an empty one is 1).
func appendCount(b []byte, isNil bool, n int) []byte {
	if isNil {
		return binary.AppendUvarint(b, 0)
	}
	return binary.AppendUvarint(b, uint64(n)+1)
}

// decisionReader reads GobEncode's encoding; the first error sticks.
type decisionReader struct {
	b   []byte
	err error
}

var errShort = errors.New("it ends early")

func (r *decisionReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *decisionReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

// take returns the next n bytes (nil after an error).
func (r *decisionReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errShort
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *decisionReader) bytes() []byte { return r.take(r.uvarint()) }

// count reads a slice's length: ok false for a nil slice (or an error).
func (r *decisionReader) count() (int, bool) {
	n := r.uvarint()
	if n == 0 || r.err != nil {
		return 0, false
	}
	if n-1 > uint64(len(r.b)) {
		r.err = fmt.Errorf("a count of %d, %d bytes left", n-1, len(r.b))
		return 0, false
	}
	return int(n - 1), true
}

// value reads a value: nil, or a copy of its bytes.
func (r *decisionReader) value() []byte {
	n, ok := r.count()
	if !ok {
		return nil
	}
	p := r.take(uint64(n))
	if p == nil {
		return nil
	}
	return append(make([]byte, 0, n), p...)
}
