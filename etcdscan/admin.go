package etcdscan

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
	"weak"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"kube-etcd-migrate/internal/dropbehind"
)

// StatusInfo summarises every member of the cluster.
type StatusInfo struct {
	DBSize      int64  // largest backend size over the members, bytes (what the quota counts)
	DBSizeInUse int64  // largest logically used size, bytes (DBSize after a defrag)
	Free        int64  // smallest DBSize-DBSizeInUse over the members: pages later writes reuse before the backend grows
	Leader      uint64 // member ID of the leader, 0 when there is none
	Version     string // etcd server version(s), comma separated when members differ
	Revision    int64  // the store's revision as the last member asked saw it
	Members     []MemberStatus
}

// Status asks every member of the cluster for its status (through the
// client's endpoints for a single member, else each member's advertised
// client URLs). A member that answers on none of its URLs is an error naming it.
func Status(ctx context.Context, cli *clientv3.Client) (StatusInfo, error) {
	ms, err := members(ctx, cli)
	if err != nil {
		return StatusInfo{}, err
	}
	info := StatusInfo{Free: -1}
	var versions []string
	for _, m := range ms {
		var st *clientv3.StatusResponse
		var ep string
		var errs []string
		for _, u := range m.urls {
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			r, err := cli.Status(sctx, u)
			cancel()
			if err == nil {
				st, ep = r, u
				break
			}
			errs = append(errs, fmt.Sprintf("%s: %v", u, err))
		}
		if st == nil {
			if ctx.Err() != nil {
				return StatusInfo{}, ctx.Err()
			}
			return StatusInfo{}, fmt.Errorf("etcd status of %s: %s", m, strings.Join(errs, "; "))
		}
		if st.DbSizeInUse == 0 {
			// A server that does not say (kine; etcd before 3.4): all of
			// the database may be in use.
			st.DbSizeInUse = st.DbSize
		}
		info.Members = append(info.Members, MemberStatus{Name: m.name, ID: m.id, Endpoint: ep, DBSize: st.DbSize, DBSizeInUse: st.DbSizeInUse})
		info.DBSize = max(info.DBSize, st.DbSize)
		info.DBSizeInUse = max(info.DBSizeInUse, st.DbSizeInUse)
		if free := st.DbSize - st.DbSizeInUse; info.Free < 0 || free < info.Free {
			info.Free = max(free, 0)
		}
		if st.Leader != 0 {
			info.Leader = st.Leader
		}
		if st.Header != nil && st.Header.Revision != 0 {
			info.Revision = max(info.Revision, st.Header.Revision)
		} else if rev, err := Revision(ctx, cli); err == nil {
			// kine's Status has no header revision: a count-only read says it.
			info.Revision = max(info.Revision, rev)
		}
		found := false
		for _, v := range versions {
			found = found || v == st.Version
		}
		if !found {
			versions = append(versions, st.Version)
		}
	}
	info.Free = max(info.Free, 0)
	info.Version = strings.Join(versions, ",")
	return info, nil
}

// Alarms lists the active cluster alarms, e.g. "NOSPACE on member 8e9e05c52164694d".
func Alarms(ctx context.Context, cli *clientv3.Client) ([]string, error) {
	resp, err := cli.AlarmList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd alarm list: %w", err)
	}
	out := make([]string, 0, len(resp.Alarms))
	for _, a := range resp.Alarms {
		out = append(out, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
	}
	return out, nil
}

// Snapshot saves a snapshot of the leader's backend (of the first endpoint when
// no leader is found) to path, restorable with etcdutl snapshot restore; a
// file already at path is never replaced (an error). See SaveSnapshot.
func Snapshot(ctx context.Context, cli *clientv3.Client, path string) error {
	_, err := SaveSnapshot(ctx, cli, path)
	return err
}

// SnapshotDigest is what SaveSnapshot wrote: the file's size and its
// sha256 (hex, as sha256sum prints it), computed as the stream was written.
type SnapshotDigest struct {
	Size   int64
	SHA256 string
}

// SaveSnapshot saves a snapshot as etcd's own snapshot.SaveWithVersion does
// (what `etcdctl snapshot save` runs: etcd's Snapshot stream from one
// member, its sha256 trailer required, fsync, rename into place) and
// returns the file's digest, taken from the bytes as they were written: no
// second read of the file. It streams into path+".part" created with mode
// 0600 (a part file left by an interrupted run is removed first, so the
// data is never written into a file of a wider mode), removed on failure;
// the directory is synced after the rename. Errors name the endpoint and
// path.
//
// It opens its own client to that one member: cli's endpoints' TLS and
// credentials are the ones Connect opened it with; a client made elsewhere
// is reached with its user and password and without TLS.
func SaveSnapshot(ctx context.Context, cli *clientv3.Client, path string) (SnapshotDigest, error) {
	ep := snapshotEndpoint(ctx, cli)
	fail := func(err error) (SnapshotDigest, error) {
		return SnapshotDigest{}, fmt.Errorf("snapshot of %s to %s: %w", ep, path, err)
	}
	if _, err := os.Lstat(path); err == nil {
		return fail(errors.New("the file exists; a snapshot is never replaced (it may be the only copy of the state before an earlier run)"))
	}
	part := path + ".part"
	if err := os.Remove(part); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(err)
	}
	cfg := configOf(cli)
	cfg.Endpoints = []string{ep}
	cfg.Logger = zap.NewNop()
	one, err := clientv3.New(cfg)
	if err != nil {
		return fail(err)
	}
	defer one.Close()
	d, err := streamSnapshot(ctx, one, part)
	if err != nil {
		_ = os.Remove(part)
		return fail(err)
	}
	if err := os.Rename(part, path); err != nil {
		_ = os.Remove(part)
		return fail(err)
	}
	if dir, err := os.Open(filepath.Dir(path)); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return d, nil
}

// streamSnapshot writes the member's snapshot stream into part (made, mode
// 0600) and hashes it on the way; the stream must end with etcd's sha256
// trailer (a size of 512*n+32), else it was cut short.
func streamSnapshot(ctx context.Context, cli *clientv3.Client, part string) (SnapshotDigest, error) {
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return SnapshotDigest{}, err
	}
	defer f.Close()
	resp, err := cli.SnapshotWithVersion(ctx)
	if err != nil {
		return SnapshotDigest{}, err
	}
	defer resp.Snapshot.Close()
	h := sha256.New()
	// Written as etcd's own snapshot save writes it, a chunk of the stream
	// at a time: large writes would leave the file in the page cache in
	// large folios, and a reader of its mapping (package snapshotdb) would
	// then fault in up to a folio's worth at each page it touches, beyond
	// the regions it keeps resident.
	// It leaves the page cache as it goes (dropbehind): a snapshot of a
	// database of gigabytes would otherwise evict etcd's own pages from it.
	size, err := io.Copy(io.MultiWriter(dropbehind.New(f), h), resp.Snapshot)
	if err != nil {
		return SnapshotDigest{}, fmt.Errorf("could not write snapshot: %w", err)
	}
	if size%512 != sha256.Size {
		return SnapshotDigest{}, fmt.Errorf("sha256 checksum not found [bytes: %d]: the stream was cut short", size)
	}
	if err := f.Sync(); err != nil {
		return SnapshotDigest{}, fmt.Errorf("could not fsync snapshot: %w", err)
	}
	if err := f.Close(); err != nil {
		return SnapshotDigest{}, err
	}
	return SnapshotDigest{Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// clientConfigs holds the configuration Connect opened each client with, until
// the client is garbage: etcd's snapshot package needs a configuration, not a
// client, and a client does not give its own back.
var clientConfigs sync.Map // weak.Pointer[clientv3.Client] -> clientv3.Config

func rememberConfig(cli *clientv3.Client, cfg clientv3.Config) {
	key := weak.Make(cli)
	clientConfigs.Store(key, cfg)
	runtime.AddCleanup(cli, func(k weak.Pointer[clientv3.Client]) { clientConfigs.Delete(k) }, key)
}

func configOf(cli *clientv3.Client) clientv3.Config {
	if cfg, ok := clientConfigs.Load(weak.Make(cli)); ok {
		return cfg.(clientv3.Config)
	}
	return clientv3.Config{Username: cli.Username, Password: cli.Password, DialTimeout: DefaultDialTimeout, Logger: zap.NewNop()}
}

func snapshotEndpoint(ctx context.Context, cli *clientv3.Client) string {
	eps := cli.Endpoints()
	if len(eps) > 1 {
		for _, ep := range eps {
			st, err := cli.Status(ctx, ep)
			if err == nil && st.Header != nil && st.Leader == st.Header.MemberId {
				return ep
			}
		}
	}
	return eps[0]
}

// Revision is etcd's current revision (one count-only read).
func Revision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly(), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("read etcd's revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// CompactRevision returns the revision etcd was last compacted at (0 when it
// never was): revisions below it can no longer be read. It binary-searches the
// oldest readable revision with count-only reads (about log2(revision) requests).
func CompactRevision(ctx context.Context, cli *clientv3.Client) (int64, error) {
	const probeKey = "\x00"
	resp, err := cli.Get(ctx, probeKey, clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("etcd compact revision: %w", err)
	}
	readable := func(rev int64) (bool, error) {
		_, err := cli.Get(ctx, probeKey, clientv3.WithCountOnly(), clientv3.WithRev(rev))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return false, nil
		}
		return err == nil, err
	}
	lo, hi := int64(1), resp.Header.Revision // the current revision is always readable
	if ok, err := readable(lo); err != nil {
		return 0, fmt.Errorf("etcd compact revision: %w", err)
	} else if ok {
		return 0, nil
	}
	for lo+1 < hi { // invariant: lo unreadable, hi readable
		mid := lo + (hi-lo)/2
		ok, err := readable(mid)
		if err != nil {
			return 0, fmt.Errorf("etcd compact revision: %w", err)
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// MemberHealth is what one member answered, or that it did not.
type MemberHealth struct {
	Name     string   `json:"name"`
	ID       uint64   `json:"id"`
	Endpoint string   `json:"endpoint"` // the client URL that answered (the first one tried when none did)
	Version  string   `json:"version,omitempty"`
	DBSize   int64    `json:"dbSize,omitempty"`
	Leader   bool     `json:"leader,omitempty"`
	Errors   []string `json:"errors,omitempty"` // what the member reports of itself (alarms, corruption)
	Err      string   `json:"error,omitempty"`  // why it did not answer
}

// Health asks every member of the cluster for its status and reports each,
// answering or not (Status stops at the first that does not).
func Health(ctx context.Context, cli *clientv3.Client) ([]MemberHealth, error) {
	ms, err := members(ctx, cli)
	if err != nil {
		return nil, err
	}
	out := make([]MemberHealth, 0, len(ms))
	for _, m := range ms {
		h := MemberHealth{Name: m.name, ID: m.id}
		var errs []string
		for _, u := range m.urls {
			sctx, cancel := context.WithTimeout(ctx, statusTimeout)
			r, err := cli.Status(sctx, u)
			cancel()
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", u, err))
				continue
			}
			h.Endpoint, h.Version, h.DBSize, h.Errors = u, r.Version, r.DbSize, r.Errors
			h.Leader = r.Header != nil && r.Leader == r.Header.MemberId
			errs = nil
			break
		}
		if len(errs) > 0 {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			h.Endpoint, h.Err = m.urls[0], strings.Join(errs, "; ")
		}
		out = append(out, h)
	}
	return out, nil
}

// SnapshotSample streams at most limit bytes of the snapshot Snapshot would
// save (the same member, the same request) and drops them: how fast etcd
// sends its backend to this machine, without writing anything anywhere.
// The stream is cut when limit is reached.
func SnapshotSample(ctx context.Context, cli *clientv3.Client, limit int64) (int64, time.Duration, error) {
	ep := snapshotEndpoint(ctx, cli)
	cfg := configOf(cli)
	cfg.Endpoints = []string{ep}
	c, err := clientv3.New(cfg)
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot of %s: %w", ep, err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	rc, err := c.Snapshot(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot of %s: %w", ep, err)
	}
	defer rc.Close()
	n, err := io.Copy(io.Discard, io.LimitReader(rc, limit))
	el := time.Since(start)
	if err != nil {
		return n, el, fmt.Errorf("snapshot of %s: %w", ep, err)
	}
	return n, el, nil
}
