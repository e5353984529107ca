package undo

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"reflect"
	"testing"
)

// TestRecordAsJSONWritesIt: appendRecord writes, for every record it takes,
// the bytes encoding/json's Encoder writes (the journal's format was, and
// is, the encoder's), and it leaves to the encoder every record with a
// string the encoder escapes.
func TestRecordAsJSONWritesIt(t *testing.T) {
	rnd := rand.New(rand.NewSource(58))
	chars := []string{"a", "Z", "0", "/", "-", ".", ":", " ", "~", "_", `"`, `\`, "<", ">", "&", "\x00", "\n", "\x1f", "\x7f", "é", "\u2028", "\xff"}
	str := func(plainOnly bool) string {
		if rnd.Intn(3) == 0 {
			return ""
		}
		var b bytes.Buffer
		for n := rnd.Intn(40); n > 0; n-- {
			c := chars[rnd.Intn(len(chars))]
			if plainOnly && !plain(c) {
				c = "x"
			}
			b.WriteString(c)
		}
		return b.String()
	}
	num := func() int64 {
		switch rnd.Intn(4) {
		case 0:
			return 0
		case 1:
			return -rnd.Int63()
		default:
			return rnd.Int63n(1<<uint(rnd.Intn(62)+1)) + 1
		}
	}
	val := func() []byte {
		switch rnd.Intn(4) {
		case 0:
			return nil
		case 1:
			return []byte{}
		}
		v := make([]byte, rnd.Intn(3000))
		rnd.Read(v)
		return v
	}
	ops := []string{"begin", "intent", "done", "delete-intent", "deleted", "create-intent", "close", ""}
	var enc bytes.Buffer
	e := json.NewEncoder(&enc)
	taken := 0
	for i := 0; i < 20000; i++ {
		plainOnly := i%2 == 0
		r := JournalRecord{Seq: num(), Op: ops[rnd.Intn(len(ops))], Key: str(plainOnly), OldModRevision: num(), OldValue: val(),
			NewSHA256: str(plainOnly), NewModRevision: num(), Revision: num(), Prefix: str(plainOnly), Command: str(plainOnly),
			OldCreateRevision: num(), OldVersion: num(), Lease: num(), Reason: str(plainOnly), DeleteRevision: num()}
		if rnd.Intn(4) == 0 {
			r.Sum = str(plainOnly)
		}
		enc.Reset()
		if err := e.Encode(r); err != nil {
			t.Fatal(err)
		}
		want := bytes.TrimSuffix(enc.Bytes(), []byte("}\n"))
		got, ok := appendRecord([]byte("prefix"), &r)
		if !ok {
			if plainOnly {
				t.Fatalf("a record of plain strings was left to the encoder: %+v", r)
			}
			if string(got) != "prefix" {
				t.Fatalf("a record left to the encoder was appended: %q", got)
			}
			continue
		}
		taken++
		if !bytes.Equal(got[len("prefix"):], want) {
			t.Fatalf("record %+v:\n got %s\nwant %s", r, got[len("prefix"):], want)
		}
	}
	if taken < 10000 {
		t.Fatalf("appendRecord took %d records of 20000", taken)
	}
}

// TestRecordFieldsKnown: appendRecord writes JournalRecord's members by
// name, in order; a member added to the struct fails here until
// appendRecord (and TestRecordAsJSONWritesIt's records) write it too.
func TestRecordFieldsKnown(t *testing.T) {
	known := []string{"seq,omitempty", "op", "key,omitempty", "oldModRevision,omitempty", "oldValue,omitempty", "newSha256,omitempty", "newModRevision,omitempty",
		"revision,omitempty", "prefix,omitempty", "command,omitempty", "oldCreateRevision,omitempty", "oldVersion,omitempty", "lease,omitempty", "reason,omitempty",
		"deleteRevision,omitempty", "sum,omitempty"}
	rt := reflect.TypeOf(JournalRecord{})
	var got []string
	for i := 0; i < rt.NumField(); i++ {
		got = append(got, rt.Field(i).Tag.Get("json"))
	}
	if !reflect.DeepEqual(got, known) {
		t.Fatalf("JournalRecord's members are %q; appendRecord writes %q", got, known)
	}
}
