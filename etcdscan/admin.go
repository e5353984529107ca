package etcdscan

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// StatusInfo summarises the members reachable through the client's endpoints.
type StatusInfo struct {
	DBSize      int64  // largest backend size over the endpoints, bytes (what the quota counts)
	DBSizeInUse int64  // largest logically used size, bytes (DBSize after a defrag)
	Leader      uint64 // member ID of the leader, 0 when there is none
	Version     string // etcd server version(s), comma separated when members differ
}

// Status asks every endpoint of the client for its status.
func Status(ctx context.Context, cli *clientv3.Client) (StatusInfo, error) {
	var info StatusInfo
	var versions []string
	for _, ep := range cli.Endpoints() {
		st, err := cli.Status(ctx, ep)
		if err != nil {
			return StatusInfo{}, fmt.Errorf("etcd status of %s: %w", ep, err)
		}
		info.DBSize = max(info.DBSize, st.DbSize)
		info.DBSizeInUse = max(info.DBSizeInUse, st.DbSizeInUse)
		if st.Leader != 0 {
			info.Leader = st.Leader
		}
		found := false
		for _, v := range versions {
			found = found || v == st.Version
		}
		if !found {
			versions = append(versions, st.Version)
		}
	}
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

// Snapshot saves a snapshot of the leader's backend (of the first endpoint
// when no leader is found) to path: written to a temporary file of mode 0600
// in the same directory, checked for etcd's sha256 trailer, synced, then
// renamed into place. The snapshot is restorable with etcdutl snapshot restore.
func Snapshot(ctx context.Context, cli *clientv3.Client, path string) (err error) {
	ep := snapshotEndpoint(ctx, cli)
	conn, err := cli.Dial(ep)
	if err != nil {
		return fmt.Errorf("snapshot: dial %s: %w", ep, err)
	}
	defer conn.Close()
	m := clientv3.NewMaintenanceFromMaintenanceClient(clientv3.RetryMaintenanceClient(cli, conn), cli)

	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".part-*")
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(0o600); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	rc, err := m.Snapshot(ctx)
	if err != nil {
		return fmt.Errorf("snapshot of %s: %w", ep, err)
	}
	defer rc.Close()
	n, err := io.Copy(f, rc)
	if err != nil {
		return fmt.Errorf("snapshot of %s: %w", ep, err)
	}
	// etcd appends the sha256 of the database; its absence means a truncated stream.
	if n%512 != sha256.Size {
		return fmt.Errorf("snapshot of %s: no sha256 trailer after %d bytes (truncated?)", ep, n)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
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
