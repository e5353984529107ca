// Package etcdscan owns every conversation with etcd: connecting with etcdctl's
// settings (Config, plain data: the command layer owns the flags), scanning a key prefix at one pinned revision in bounded pages, and writing
// values back with compare-and-swap on each key's mod revision, keeping its lease.
package etcdscan

// KV is one key as read from etcd at the scan revision.
type KV struct {
	Key            string
	Value          []byte
	ModRevision    int64
	CreateRevision int64
	Version        int64
	Lease          int64 // 0 when the key has no lease
	// ModSub is the sub-revision of the key's record within its mod
	// revision's transaction: known to a snapshot file read in place (etcd's
	// API does not give it; 0 from etcd). An output snapshot's writer needs it
	// to tell apart keys a transaction wrote at one revision.
	ModSub int64
}

// KVMeta is what a key as read carries beyond its value and mod revision:
// what an update keeps (create revision, lease) or counts on (version).
type KVMeta struct {
	ModSub         int64
	CreateRevision int64
	Version        int64
	Lease          int64
}

// Meta returns the key's KVMeta.
func (kv KV) Meta() KVMeta {
	return KVMeta{ModSub: kv.ModSub, CreateRevision: kv.CreateRevision, Version: kv.Version, Lease: kv.Lease}
}
