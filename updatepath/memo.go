package updatepath

import (
	"encoding/binary"
	"sort"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Why a no-op update's field manager can be skipped, and when.
//
// On a no-op update (GET, then PUT unchanged) kube-apiserver's field manager
// (managedfields.FieldManager.UpdateNoErrors, the chain NewDefaultFieldManager
// builds) decodes the managedFields, converts the live and the new object to
// typed values, reconciles every entry's field set with the schema of its
// version, compares the two objects, drops the entries of versions it does
// not serve, merges the oldest update managers beyond ten, and encodes the
// entries again, sorted. On most objects it changes nothing, and it is most
// of the tool's CPU. Memo remembers, per kind and managedFields, that it
// changed nothing, and the field manager is skipped for another object with
// the same key. That is exact, for these reasons (read from
// k8s.io/apimachinery/pkg/util/managedfields/internal and
// sigs.k8s.io/structured-merge-diff/v6/merge at the linked release):
//
//   - What the field manager writes is a function of the managedFields
//     entries (manager, operation, apiVersion, subresource, fieldsType,
//     fieldsV1), of the order of their times (capManagersManager sorts the
//     update managers by time.Unix() to pick which to merge, and the encoder
//     sorts the entries by operation, time.Unix(), manager, apiVersion,
//     subresource; nothing else reads a time, and the times themselves are
//     passed through), of the kind (which field manager, which served
//     versions, which schema; ReconcileFieldSetWithSchema reads the field
//     set and the schema only) and of whether the object has a UID
//     (skipNonAppliedManager, only when no entry decodes). The key holds
//     exactly these: every entry's fields byte for byte, its time as the
//     rank of its Unix second among the entries' (nil as 0, as they read
//     it), the kind and the UID's presence.
//   - The object's content enters only through the typed values, and on a
//     no-op update the live and the new object are the same object, the new
//     one without managedFields (FieldManager.Update removes them before the
//     chain runs): their comparison, in the request version and in every
//     other served version an entry names, has nothing added or modified,
//     and removed only metadata.managedFields (an atomic list), whatever the
//     content, as long as converting an object is deterministic and its
//     values equal themselves. kube-apiserver relies on the same (it skips a
//     write when its bytes equal the stored ones); the values of built-in
//     types are strings, integers, booleans and JSON documents, and
//     kube-apiserver's CBOR and JSON decoders refuse NaN. With nothing added
//     or modified, no entry is added under the updating manager and no time
//     is set (managedFieldsUpdater reads time.Now only then).
//   - The content can still make the field manager fail: a conversion that
//     fails, a typed value the schema refuses (the other versions' typed
//     values do not allow duplicate keys). Then UpdateNoErrors keeps the live
//     object's managedFields, which are the stored ones: nothing changes.
//
// So when the field manager ran to the end without an error on one object
// and gave back its managedFields unchanged, it gives them back unchanged,
// or fails and keeps them, on every object with the same key: only that
// verdict is remembered. A verdict that changed something, or that came from
// a failure (kept because of the failure, which another object's content may
// not have), is never remembered: such objects always run the field manager.
// --full-field-manager runs it on every object; the differential tests
// (memo_test.go here, customresource's) run a generated corpus through both.

// memoBudget bounds the bytes of keys a Memo holds; past it the memo starts
// over (the keyspace is read resource by resource, so the shapes of the
// resource being read come back).
const memoBudget = 4 << 20

// Memo remembers the managedFields on which a no-op update's field manager
// provably changes nothing (see above). It is safe for concurrent use.
type Memo struct {
	mu    sync.RWMutex
	seen  map[string]struct{}
	bytes int
	pool  sync.Pool
}

// MemoKey is the key of one object's managedFields, built by Memo.Key; Done
// returns it to the memo's pool.
type MemoKey struct {
	m   *Memo
	buf *[]byte
}

// Key builds the key of entries under scope (the kind, and for custom
// resources the object's apiVersion), for an object with or without a UID.
func (m *Memo) Key(scope string, hasUID bool, entries []metav1.ManagedFieldsEntry) MemoKey {
	bp, _ := m.pool.Get().(*[]byte)
	if bp == nil {
		bp = new([]byte)
	}
	b := (*bp)[:0]
	b = appendString(b, scope)
	if hasUID {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(entries)))
	ranks := timeRanks(entries)
	for i := range entries {
		e := &entries[i]
		b = appendString(b, e.Manager)
		b = appendString(b, string(e.Operation))
		b = appendString(b, e.APIVersion)
		b = appendString(b, e.Subresource)
		b = appendString(b, e.FieldsType)
		if e.FieldsV1 == nil {
			b = append(b, 0)
		} else {
			b = append(b, 1)
			raw := e.FieldsV1.GetRawBytes()
			b = binary.AppendUvarint(b, uint64(len(raw)))
			b = append(b, raw...)
		}
		if e.Time == nil {
			b = append(b, 0)
		} else {
			b = append(b, 1)
		}
		b = binary.AppendUvarint(b, uint64(ranks[i]))
	}
	*bp = b
	return MemoKey{m: m, buf: bp}
}

// Known reports whether the field manager was seen to change nothing on
// managedFields with this key.
func (k MemoKey) Known() bool {
	k.m.mu.RLock()
	_, ok := k.m.seen[string(*k.buf)]
	k.m.mu.RUnlock()
	return ok
}

// Remember records that the field manager ran without an error and changed
// nothing on managedFields with this key.
func (k MemoKey) Remember() {
	m := k.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.seen[string(*k.buf)]; ok {
		return
	}
	if m.seen == nil || m.bytes+len(*k.buf) > memoBudget {
		m.seen, m.bytes = map[string]struct{}{}, 0
	}
	m.seen[string(*k.buf)] = struct{}{}
	m.bytes += len(*k.buf)
}

// Done gives the key's buffer back.
func (k MemoKey) Done() {
	if cap(*k.buf) <= 64<<10 {
		k.m.pool.Put(k.buf)
	}
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// timeRanks gives each entry the rank of its time's Unix second among the
// entries' distinct ones (a nil time is second 0, as the field manager reads
// it): the order every comparison of two entries' times gives.
func timeRanks(entries []metav1.ManagedFieldsEntry) []int {
	secs := make([]int64, len(entries))
	for i := range entries {
		if t := entries[i].Time; t != nil {
			secs[i] = t.Unix()
		}
	}
	ranks := make([]int, len(entries))
	if len(entries) == 1 {
		return ranks
	}
	sorted := append([]int64(nil), secs...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	distinct := sorted[:0]
	for i, s := range sorted {
		if i == 0 || s != distinct[len(distinct)-1] {
			distinct = append(distinct, s)
		}
	}
	for i, s := range secs {
		ranks[i] = sort.Search(len(distinct), func(j int) bool { return distinct[j] >= s })
	}
	return ranks
}

// Len is the number of keys remembered.
func (m *Memo) Len() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.seen)
}

// Memo is the path's memo, for the custom resources' field managers to share
// (customresource.Options.Memo): their keys are scoped by CRD, the
// built-ins' by kind, and they share one budget.
func (p *Path) Memo() *Memo { return &p.memo }
