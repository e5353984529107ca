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
}
