package reencode

import (
	"encoding/binary"
	"errors"
	"fmt"

	"kube-etcd-migrate/decode"
)

// A run keeps batches of its stale decisions on disk while its writes wait
// (the first write's wait, a compaction's: package guard's Spool and
// Backlog). A Decision encodes itself for them (AppendSpooled, ReadSpooled):
// every field in one fixed order, strings and values with their lengths
// first, numbers as varints, a nil slice or pointer told from an empty one;
// gob took about a tenth of a key rotation's CPU (a profile) for the
// same, field by field through reflection, and copied every value twice
// more. An Err with an error inside is refused, as gob refused it (its
// type is not registered).
// The encoding lives and dies with the process (the files are unlinked at
// once): it has no version.

// AppendSpooled appends d's encoding to b.
func (d *Decision) AppendSpooled(b []byte) ([]byte, error) {
	if d.Err != nil && d.Err.Err != nil {
		return b, fmt.Errorf("%s: a decision whose error holds an error (%T) is not kept on disk", d.Key, d.Err.Err)
	}
	for _, s := range [...]string{d.Key, d.Resource.Group, d.Resource.Resource, string(d.Status),
		d.From.Version, d.From.MediaType, d.From.Encryption, d.To.Version, d.To.MediaType, d.To.Encryption} {
		b = appendString(b, s)
	}
	b = appendCount(b, d.Reasons == nil, len(d.Reasons))
	for _, r := range d.Reasons {
		b = appendString(b, string(r))
	}
	if d.Err == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		for _, s := range [...]string{d.Err.Key, string(d.Err.Reason), d.Err.Detail, string(d.Err.Orphan)} {
			b = appendString(b, s)
		}
	}
	b = appendCount(b, d.Dropped == nil, len(d.Dropped))
	for _, s := range d.Dropped {
		b = appendString(b, s)
	}
	for _, v := range [...]int64{d.ModRevision, d.Lease, d.Read.ModSub, d.Read.CreateRevision, d.Read.Version, d.Read.Lease, int64(d.OldSize)} {
		b = binary.AppendVarint(b, v)
	}
	for _, v := range [...][]byte{d.OldValue, d.NewValue} {
		b = appendCount(b, v == nil, len(v))
		b = append(b, v...)
	}
	return b, nil
}

// ReadSpooled sets d to the decision AppendSpooled encoded at the start of
// b, and returns what follows it. d's values are b's bytes, not copies:
// b must not be written to while d is in use.
func (d *Decision) ReadSpooled(b []byte) ([]byte, error) {
	r := spoolReader{b: b}
	*d = Decision{}
	d.Key, d.Resource.Group, d.Resource.Resource, d.Status = r.str(), r.str(), r.str(), Status(r.str())
	d.From = Form{Version: r.str(), MediaType: r.str(), Encryption: r.str()}
	d.To = Form{Version: r.str(), MediaType: r.str(), Encryption: r.str()}
	if n, ok := r.count(); ok {
		d.Reasons = make([]Reason, n)
		for i := range d.Reasons {
			d.Reasons[i] = Reason(r.str())
		}
	}
	switch r.byte() {
	case 0:
	case 1:
		d.Err = &decode.Error{Key: r.str(), Reason: decode.Reason(r.str()), Detail: r.str(), Orphan: decode.Orphan(r.str())}
	default:
		r.fail(errors.New("its error is neither absent nor present"))
	}
	if n, ok := r.count(); ok {
		d.Dropped = make([]string, n)
		for i := range d.Dropped {
			d.Dropped[i] = r.str()
		}
	}
	var oldSize int64
	for _, p := range [...]*int64{&d.ModRevision, &d.Lease, &d.Read.ModSub, &d.Read.CreateRevision, &d.Read.Version, &d.Read.Lease, &oldSize} {
		*p = r.varint()
	}
	d.OldSize = int(oldSize)
	d.OldValue = r.value()
	d.NewValue = r.value()
	if r.err != nil {
		*d = Decision{}
		return b, fmt.Errorf("a decision kept on disk does not read back: %w", r.err)
	}
	return r.b, nil
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

// appendCount appends a slice's length: 0 for a nil slice, else one more
// than its length.
func appendCount(b []byte, isNil bool, n int) []byte {
	if isNil {
		return append(b, 0)
	}
	return binary.AppendUvarint(b, uint64(n)+1)
}

// spoolReader reads AppendSpooled's encoding; its first error sticks.
type spoolReader struct {
	b   []byte
	err error
}

var errSpoolShort = errors.New("it ends early")

func (r *spoolReader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

func (r *spoolReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errSpoolShort)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *spoolReader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail(errSpoolShort)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *spoolReader) byte() byte {
	if len(r.b) == 0 {
		r.fail(errSpoolShort)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// take returns the next n bytes (nil once it failed).
func (r *spoolReader) take(n uint64) []byte {
	if n > uint64(len(r.b)) {
		r.fail(errSpoolShort)
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *spoolReader) str() string { return string(r.take(r.uvarint())) }

// count reads a slice's length: ok false for a nil slice (or once it
// failed); no more than the bytes left, each item taking at least one.
func (r *spoolReader) count() (int, bool) {
	n := r.uvarint()
	if n == 0 || r.err != nil {
		return 0, false
	}
	if n-1 > uint64(len(r.b)) {
		r.fail(fmt.Errorf("a count of %d, %d bytes left", n-1, len(r.b)))
		return 0, false
	}
	return int(n - 1), true
}

// value reads a value: nil, or b's bytes.
func (r *spoolReader) value() []byte {
	n, ok := r.count()
	if !ok {
		return nil
	}
	return r.take(uint64(n))
}
