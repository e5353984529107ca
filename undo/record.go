package undo

import (
	"encoding/base64"
	"strconv"
)

// appendRecord appends to b the bytes encoding/json's Encoder writes for
// r before its closing brace (P, see write), with Sum empty: every member
// in JournalRecord's order, those with omitempty left out when empty, an
// old value in standard base64. It takes the encoder's place for a record
// whose strings need no escaping (printable ASCII without '"', '\\', '<',
// '>' or '&', which the encoder writes as they are): ok is false for any
// other, and b is then to be thrown away (the encoder writes that record).
// TestRecordAsJSONWritesIt holds it to the encoder's bytes.
func appendRecord(b []byte, r *JournalRecord) (_ []byte, ok bool) {
	if !plain(r.Op) || !plain(r.Key) || !plain(r.NewSHA256) || !plain(r.Prefix) || !plain(r.Command) || !plain(r.Reason) || !plain(r.Sum) {
		return b, false
	}
	b = append(b, '{')
	comma := false
	num := func(name string, v int64) {
		if v == 0 {
			return
		}
		if comma {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, v, 10)
		comma = true
	}
	str := func(name, v string, omitEmpty bool) {
		if v == "" && omitEmpty {
			return
		}
		if comma {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":"`...)
		b = append(b, v...)
		b = append(b, '"')
		comma = true
	}
	num("seq", r.Seq)
	str("op", r.Op, false)
	str("key", r.Key, true)
	num("oldModRevision", r.OldModRevision)
	if len(r.OldValue) > 0 {
		if comma {
			b = append(b, ',')
		}
		b = append(b, `"oldValue":"`...)
		b = base64.StdEncoding.AppendEncode(b, r.OldValue)
		b = append(b, '"')
		comma = true
	}
	str("newSha256", r.NewSHA256, true)
	num("newModRevision", r.NewModRevision)
	num("revision", r.Revision)
	str("prefix", r.Prefix, true)
	str("command", r.Command, true)
	num("oldCreateRevision", r.OldCreateRevision)
	num("oldVersion", r.OldVersion)
	num("lease", r.Lease)
	str("reason", r.Reason, true)
	num("deleteRevision", r.DeleteRevision)
	str("sum", r.Sum, true)
	return b, true
}

// plain says whether encoding/json writes s as it is, between quotes.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}
