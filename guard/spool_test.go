package guard

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

type spooled struct {
	Key      string
	Rev      int64
	Old, New []byte
	Reasons  []string
	Meta     struct{ Lease, Version int64 }
	Err      *struct{ Why string }
}

// selfSpooled is a spooled that encodes itself (selfCoded): its JSON,
// its length first.
type selfSpooled spooled

func (s *selfSpooled) AppendSpooled(b []byte) ([]byte, error) {
	j, err := json.Marshal(s)
	if err != nil {
		return b, err
	}
	return append(binary.AppendUvarint(b, uint64(len(j))), j...), nil
}

func (s *selfSpooled) ReadSpooled(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return b, errors.New("it ends early")
	}
	*s = selfSpooled{}
	return b[k+int(n):], json.Unmarshal(b[k:k+int(n)], s)
}

// TestSpoolHoldsBatchesAndLeavesNothing: a spool gives back every batch it
// took, whole and in order, and takes none past its room (that batch is
// left to its caller, and so is every one after a batch it refused first);
// its file is gone from the run directory from the start, so nothing of
// the values it held is left there, whatever ends the process.
func TestSpoolHoldsBatchesAndLeavesNothing(t *testing.T) {
	t.Run("gob", func(t *testing.T) { testSpool(t, func(s spooled) spooled { return s }) })
	t.Run("self-coded", func(t *testing.T) { testSpool(t, func(s spooled) selfSpooled { return selfSpooled(s) }) })
}

func testSpool[T any](t *testing.T, conv func(spooled) T) {
	dir := t.TempDir()
	batch := func(b, n int) []T {
		out := make([]T, n)
		for i := range out {
			d := spooled{Key: fmt.Sprintf("/registry/secrets/ns/%d-%d", b, i), Rev: int64(b*100 + i),
				Old: bytes.Repeat([]byte{byte(i)}, 2000), New: []byte("k8s:enc:aescbc:v1:key2:" + fmt.Sprint(i)),
				Reasons: []string{"encryption-key"}}
			d.Meta.Lease = int64(i)
			if i == 1 {
				d.Err = &struct{ Why string }{"kept as is"}
			}
			out[i] = conv(d)
		}
		return out
	}
	s, err := OpenSpool[T](dir, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the spool's file is in the run directory: %v", ents)
	}
	var want [][]T
	for b := 0; ; b++ {
		bt := batch(b, 5)
		if !s.Add(bt, 5*2100) {
			break
		}
		want = append(want, bt)
	}
	if len(want) < 3 || len(want) > 7 || s.Batches() != len(want) {
		t.Fatalf("a spool of 64 KiB took %d batches of about 10 KB (says %d)", len(want), s.Batches())
	}
	if s.Add(batch(99, 1), 2100) {
		t.Fatal("a smaller batch was taken after a refused one: it would come back before it")
	}
	var got [][]T
	if err := s.Drain(func(b []T) error { got = append(got, b); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("drained %d batches, %d were taken", len(got), len(want))
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("batch %d did not come back as it was taken", i)
		}
	}
	if s.Add(batch(100, 1), 10) || s.Batches() != 0 {
		t.Error("a drained spool took another batch")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the run directory holds %v", ents)
	}

	// fn's error stops the drain.
	s2, err := OpenSpool[T](dir, SpoolMax)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	s2.Add(batch(0, 1), 10)
	s2.Add(batch(1, 1), 10)
	stop := errors.New("the run stopped")
	n := 0
	if err := s2.Drain(func([]T) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Errorf("drain with fn failing: %v after %d batches", err, n)
	}

	// A directory that is not there: no spool, said.
	if _, err := OpenSpool[T](dir+"/gone", SpoolMax); err == nil {
		t.Error("a spool opened in a directory that is not there")
	}
}

// TestBacklogIsAQueueOnDisk: a backlog gives back every batch it took, whole
// and in the order it took them, while it is added to from another
// goroutine; it takes none past its room, and takes batches again once it was
// emptied (its disk given back); its file is gone from the run directory
// from the start; a batch damaged on disk is an error naming the backlog,
// never a batch made up.
func TestBacklogIsAQueueOnDisk(t *testing.T) {
	t.Run("gob", func(t *testing.T) { testBacklog(t, func(s spooled) spooled { return s }) })
	t.Run("self-coded", func(t *testing.T) { testBacklog(t, func(s spooled) selfSpooled { return selfSpooled(s) }) })
}

func testBacklog[T any](t *testing.T, conv func(spooled) T) {
	dir := t.TempDir()
	batch := func(b int) []T {
		out := make([]T, 3)
		for i := range out {
			out[i] = conv(spooled{Key: fmt.Sprintf("/registry/secrets/ns/%d-%d", b, i), Rev: int64(b*10 + i),
				Old: bytes.Repeat([]byte{byte(b)}, 1500), New: []byte(fmt.Sprint("k8s:enc:aescbc:v1:key2:", b, i))})
		}
		return out
	}
	q, err := OpenBacklog[T](dir, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the backlog's file is in the run directory: %v", ents)
	}

	// Full: it refuses, and the batch stays with its caller.
	n := 0
	for q.Push(batch(n)) {
		n++
	}
	if n < 5 || n > 15 || q.Len() != n {
		t.Fatalf("a backlog of 64 KiB took %d batches of about 4.6 KB (says %d)", n, q.Len())
	}
	for i := 0; i < n; i++ {
		got, ok, err := q.Pop()
		if err != nil || !ok || !reflect.DeepEqual(got, batch(i)) {
			t.Fatalf("batch %d came back as %v, ok %v: %v", i, got, ok, err)
		}
	}
	if _, ok, err := q.Pop(); ok || err != nil {
		t.Fatalf("an empty backlog gave a batch (%v)", err)
	}
	if fi, err := q.f.Stat(); err != nil || fi.Size() != 0 {
		t.Fatalf("an emptied backlog still takes %d bytes (%v)", fi.Size(), err)
	}

	// Added to while it is read: every batch once, in order.
	const total = 400
	go func() {
		for i := 0; i < total; {
			if q.Push(batch(i)) {
				i++
			}
		}
	}()
	for i := 0; i < total; {
		got, ok, err := q.Pop()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		if !reflect.DeepEqual(got, batch(i)) {
			t.Fatalf("batch %d came back as batch %d", i, reflect.ValueOf(got[0]).FieldByName("Rev").Int()/10)
		}
		i++
	}
	if q.Pushed() != n+total {
		t.Fatalf("took %d batches in all, want %d", q.Pushed(), n+total)
	}

	// A batch damaged on disk.
	if !q.Push(batch(7)) {
		t.Fatal("an emptied backlog refused a batch")
	}
	if _, err := q.f.WriteAt(bytes.Repeat([]byte{0xff}, 64), 8); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := q.Pop(); err == nil || ok || got != nil || !strings.Contains(err.Error(), "backlog .backlog-") {
		t.Fatalf("a damaged batch: %v, ok %v, %v", got, ok, err)
	}

	if _, err := OpenBacklog[T](dir+"/gone", BacklogMax); err == nil {
		t.Error("a backlog opened in a directory that is not there")
	}

	// Its first batch refused for room after it was encoded: the batches
	// after it read back (the stream they share lost nothing with it).
	small, err := OpenBacklog[T](dir, 8<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if small.Push(append(batch(1), batch(2)...)) {
		t.Fatal("a backlog of 8 KiB took a batch of about 9 KB")
	}
	if !small.Push(batch(3)[:1]) {
		t.Fatal("a backlog of 8 KiB refused a batch of 1.5 KB after one too large")
	}
	if got, ok, err := small.Pop(); err != nil || !ok || !reflect.DeepEqual(got, batch(3)[:1]) {
		t.Fatalf("the batch after a refused one came back as %v, ok %v: %v", got, ok, err)
	}
}
