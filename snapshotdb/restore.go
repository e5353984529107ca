// Restore opens an etcd snapshot file — what `etcdctl snapshot save`,
// `migrate --snapshot` or this package's Save write, or a member's member/snap/db —
// as an ordinary etcd client, never writing to the file: it checks the file
// (etcd's sha256 trailer, the bbolt structure, etcd's buckets), restores a copy
// with etcdutl's own restore code into a private temporary directory, and serves
// it with an embedded etcd that listens only on a unix socket inside that
// directory, so that inventory, inspect, verify, migrate and quarantine run
// against it unchanged. While it is open every lease is kept alive, so no key
// expires under the tool; Save writes the (possibly rewritten) keyspace as a new
// snapshot file, and Close removes the directory.

package snapshotdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/loopback"
)

// Options tune Open.
type RestoreOptions struct {
	// SkipHashCheck reads a file without etcd's sha256 trailer (a member's
	// member/snap/db) or whose trailer does not match, as etcdutl's
	// --skip-hash-check does; every record is then read through once to make
	// sure etcd can restore it.
	SkipHashCheck bool
	// Username and Password authenticate to a snapshot of a cluster that had etcd
	// auth enabled (the restored etcd enforces it).
	Username, Password string
	// QuotaBackendBytes is the private etcd's quota (0: etcd's default, 2 GiB).
	QuotaBackendBytes int64
	// TempDir is where the private data directory is created: it needs room
	// for a copy of the file. "" is os.TempDir() ($TMPDIR).
	TempDir string

	// noKeepAlive disables the keepalives (tests: to show what they prevent).
	noKeepAlive bool
}

// electionMs is the private etcd's election timeout, etcd's default. When the
// member becomes leader, every restored lease gets its TTL (at least etcd's
// minimum, 1.5 election timeouts) plus one election timeout: at least 2.5 s
// before the keepalives, started as soon as the member is ready (well under a
// second), must have renewed it. Kubernetes' shortest leases are the 15 s
// master leases. A longer timeout would only delay the start: a single member
// waits up to two timeouts to elect itself.
const electionMs = 1000

// RestoredInfo describes a backup restored into a private etcd: what snapshotdb reads of it in
// place (path, size, hash check, revisions, leases, the versions of the etcd
// that wrote it, which Save keeps: an etcd refuses a data directory of a
// newer schema or cluster version than its own), and what the private etcd
// can count besides.
type RestoredInfo struct {
	Info
	// LeasedKeys counts the keys attached to a lease.
	LeasedKeys int64 `json:"leasedKeys"`
}

// Snapshot is a snapshot file served by a private embedded etcd.
type Restored struct {
	// Client talks to the private etcd; it is closed by Close.
	Client *clientv3.Client
	Info   RestoredInfo

	dir      string
	etcd     *embed.Etcd
	leases   []clientv3.LeaseID
	stopKA   context.CancelFunc
	kaDone   sync.WaitGroup
	closeErr error
	once     sync.Once
}

// open directories, removed by RemoveTempDirs when the process must exit at once.
var (
	openMu   sync.Mutex
	openDirs = map[string]bool{}
	exiting  bool // RemoveTempDirs ran: the process is exiting, Open makes nothing more
)

// RemoveTempDirs removes the private directories of every snapshot still open.
// It is for a process about to exit without running its deferred Close calls
// (a second SIGINT); the etcd servers are not stopped.
func RemoveRestoreDirs() {
	openMu.Lock()
	defer openMu.Unlock()
	exiting = true
	for d := range openDirs {
		// etcdutl's restore or the embedded etcd may still be creating files
		// in it, and their MkdirAll recreates a directory removed under them:
		// remove it until it has stayed gone for four checks in a row (20 ms),
		// for at most half a second (the process exits right after). A
		// directory gone at the first check only was seen left behind under
		// load.
		for gone, deadline := 0, time.Now().Add(500*time.Millisecond); gone < 4 && time.Now().Before(deadline); {
			_ = os.RemoveAll(d)
			if _, err := os.Stat(d); os.IsNotExist(err) {
				gone++
			} else {
				gone = 0
			}
			time.Sleep(5 * time.Millisecond)
		}
		delete(openDirs, d)
	}
}

// Open checks the snapshot file at path, restores it into a new private
// directory and serves it. The private etcd runs in this process: its heap
// (its index of every key and revision, bbolt's write buffers) is far above
// a soft memory limit sized for a scan's pages, so the program sets none
// while one is open (the command line does, before anything is opened). The file is opened read-only and never changed.
// Errors are one line naming the file. The caller must Close the snapshot.
func Restore(ctx context.Context, path string, opts RestoreOptions) (s *Restored, err error) {
	size, hash, v, err := Check(path, opts.SkipHashCheck)
	if err != nil {
		return nil, err
	}
	// Made and registered under the lock, so that a RemoveTempDirs racing
	// with it (a second SIGINT) either sees it or stops it being made.
	openMu.Lock()
	if exiting {
		openMu.Unlock()
		return nil, fmt.Errorf("snapshot file %s: interrupted", path)
	}
	dir, err := os.MkdirTemp(opts.TempDir, "kube-etcd-migrate-snapshot-")
	if err != nil {
		openMu.Unlock()
		return nil, fmt.Errorf("snapshot file %s: private directory: %w", path, err)
	}
	openDirs[dir] = true
	openMu.Unlock()
	s = &Restored{dir: dir, Info: RestoredInfo{Info: Info{Path: path, Size: size, Hash: hash, StorageVersion: v.Storage, ClusterVersion: v.Cluster}}}
	defer func() {
		if r := recover(); r != nil {
			err = FileError(path, "etcd could not restore it: %v", r)
		}
		if err != nil {
			s.Close()
			s = nil
		}
	}()
	if err := s.restoreAndStart(ctx, path, opts); err != nil {
		return s, err
	}
	if err := s.connect(ctx, path, opts); err != nil {
		return s, err
	}
	if !opts.noKeepAlive {
		s.keepLeasesAlive()
	}
	if err := s.describe(ctx); err != nil {
		return s, FileError(path, "%v", err)
	}
	return s, nil
}

const memberName = "kube-etcd-migrate"

func (s *Restored) restoreAndStart(ctx context.Context, path string, opts RestoreOptions) error {
	token := make([]byte, 8)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	clusterToken := "kube-etcd-migrate-" + hex.EncodeToString(token)
	dataDir := filepath.Join(s.dir, "data")
	var lastErr error
	// The peer listener needs a TCP port (etcd takes only a host for a unix peer
	// socket): a free loopback port is picked, and picked again if another
	// process took it in between. Clients only ever use the unix socket.
	for attempt := 0; attempt < 3; attempt++ {
		port, err := loopback.FreePort()
		if err != nil {
			return FileError(path, "pick a loopback port: %v", err)
		}
		peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", port)}
		if err := os.RemoveAll(dataDir); err != nil {
			return err
		}
		err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath:        path,
			Name:                memberName,
			OutputDataDir:       dataDir,
			PeerURLs:            []string{peer.String()},
			InitialCluster:      memberName + "=" + peer.String(),
			InitialClusterToken: clusterToken,
			SkipHashCheck:       opts.SkipHashCheck,
		})
		if err != nil {
			return FileError(path, "etcd restore: %v", err)
		}
		e, err := startEtcd(ctx, s.dir, dataDir, peer, clusterToken, opts)
		if err != nil {
			lastErr = err
			if strings.Contains(err.Error(), "address already in use") {
				continue
			}
			return FileError(path, "start a private etcd on it: %v", err)
		}
		s.etcd = e
		return nil
	}
	return FileError(path, "start a private etcd on it: %v", lastErr)
}

func startEtcd(ctx context.Context, dir, dataDir string, peer url.URL, token string, opts RestoreOptions) (*embed.Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Name = memberName
	cfg.Dir = dataDir
	client := url.URL{Scheme: "unix", Path: filepath.Join(dir, "etcd.sock")}
	cfg.ListenClientUrls = []url.URL{client}
	// etcd wants a host:port to advertise (in its membership); nothing dials it.
	cfg.AdvertiseClientUrls = []url.URL{{Scheme: "unix", Host: "localhost:0"}}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = memberName + "=" + peer.String()
	cfg.InitialClusterToken = token
	cfg.ElectionMs = electionMs
	// A throw-away copy: a crash loses nothing that is not in the file.
	cfg.UnsafeNoFsync = true
	// Save compacts the copy: etcd paces a compaction for the clients of a
	// live member (1,000 revisions a batch, 10 ms between batches: 1.3 s of
	// sleep alone for a file of 100,000 keys, 13 s for a million); the copy
	// has no other client.
	cfg.CompactionBatchLimit = 10000
	cfg.CompactionSleepInterval = time.Microsecond
	if opts.QuotaBackendBytes > 0 {
		cfg.QuotaBackendBytes = opts.QuotaBackendBytes
	}
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, err
	case <-ctx.Done():
		e.Close()
		return nil, ctx.Err()
	case <-time.After(2 * time.Minute):
		e.Close()
		return nil, errors.New("not ready within 2 minutes")
	}
}

func (s *Restored) connect(ctx context.Context, path string, opts RestoreOptions) error {
	cli, err := etcdscan.Connect(ctx, etcdscan.Config{
		Endpoints:      []string{"unix://" + filepath.Join(s.dir, "etcd.sock")},
		Username:       opts.Username,
		Password:       opts.Password,
		DialTimeout:    10 * time.Second,
		CommandTimeout: etcdscan.DefaultCommandTimeout,
	})
	if err != nil {
		return FileError(path, "%v", err)
	}
	s.Client = cli
	return nil
}

// keepLeasesAlive renews every lease of the snapshot for as long as it is open.
// A restored member gives each lease its full TTL when it becomes leader and
// revokes it (deleting its keys) when that runs out: events carry kube-apiserver's
// --event-ttl (1h), master leases 15 s. Renewals are not written to the
// database: a saved snapshot keeps every lease with its TTL.
func (s *Restored) keepLeasesAlive() {
	ctx, cancel := context.WithCancel(context.Background())
	s.stopKA = cancel
	resp, err := s.Client.Leases(ctx)
	if err != nil {
		return // describe reports it
	}
	for _, l := range resp.Leases {
		s.leases = append(s.leases, l.ID)
		ch, err := s.Client.KeepAlive(ctx, l.ID)
		if err != nil {
			continue // CheckLeases finds it gone
		}
		s.kaDone.Add(1)
		go func() {
			defer s.kaDone.Done()
			for range ch {
			}
		}()
	}
}

func (s *Restored) describe(ctx context.Context) error {
	resp, err := s.Client.Get(ctx, "\x00", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	s.Info.Revision = resp.Header.Revision
	s.Info.CompactRevision, err = etcdscan.CompactRevision(ctx, s.Client)
	if err != nil {
		return err
	}
	leases, err := s.Client.Leases(ctx)
	if err != nil {
		return fmt.Errorf("list leases: %w", err)
	}
	s.Info.Leases = len(leases.Leases)
	if s.leases == nil {
		for _, l := range leases.Leases {
			s.leases = append(s.leases, l.ID)
		}
	}
	for _, l := range leases.Leases {
		ttl, err := s.Client.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			return fmt.Errorf("lease %016x: %w", int64(l.ID), err)
		}
		s.Info.LeasedKeys += int64(len(ttl.Keys))
	}
	return nil
}

// CheckLeases fails when a lease of the snapshot is gone (revoked: its keys
// deleted) — which the keepalives exist to prevent — and, when readOnly, when
// the revision moved (something wrote to the private etcd).
func (s *Restored) CheckLeases(ctx context.Context, readOnly bool) error {
	resp, err := s.Client.Leases(ctx)
	if err != nil {
		return fmt.Errorf("snapshot file %s: list leases: %w", s.Info.Path, err)
	}
	have := map[clientv3.LeaseID]bool{}
	for _, l := range resp.Leases {
		have[l.ID] = true
	}
	var lost []string
	for _, id := range s.leases {
		if !have[id] {
			lost = append(lost, fmt.Sprintf("%016x", int64(id)))
		}
	}
	if len(lost) > 0 {
		sort.Strings(lost)
		return fmt.Errorf("snapshot file %s: %d lease(s) expired in the private etcd while it was open (their keys are gone from it): %s", s.Info.Path, len(lost), strings.Join(lost, ", "))
	}
	if readOnly {
		g, err := s.Client.Get(ctx, "\x00", clientv3.WithCountOnly())
		if err != nil {
			return fmt.Errorf("snapshot file %s: read: %w", s.Info.Path, err)
		}
		if g.Header.Revision != s.Info.Revision {
			return fmt.Errorf("snapshot file %s: the private etcd moved from revision %d to %d during a read-only run", s.Info.Path, s.Info.Revision, g.Header.Revision)
		}
	}
	return nil
}

// CheckOutput refuses an output path that would overwrite the input, or an
// existing file without force, before any work is done.
func CheckOutput(in, out string, force bool) error {
	if out == "" {
		return input.Errorf("%s: no file given", input.OutputSnapshot)
	}
	ofi, err := os.Stat(out)
	switch {
	case err == nil:
		if ifi, ierr := os.Stat(in); ierr == nil && os.SameFile(ifi, ofi) {
			return input.Errorf("%s %s is the %s itself, which is never modified: write elsewhere", input.OutputSnapshot, out, input.SnapshotFile)
		}
		if !ofi.Mode().IsRegular() {
			return input.Errorf("%s %s: not a regular file", input.OutputSnapshot, out)
		}
		if !force {
			return input.Errorf("%s %s exists: remove it or pass %s to replace it", input.OutputSnapshot, out, input.Force)
		}
	case !errors.Is(err, os.ErrNotExist):
		return input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, "."+filepath.Base(out)+".probe-*")
	if err != nil {
		return input.Errorf("%s %s: cannot write in %s: %w", input.OutputSnapshot, out, dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// Save writes the private etcd's keyspace to out as an etcd snapshot (mode
// 0600, with etcd's sha256 trailer), atomically: the file appears complete or
// not at all, and an existing out is replaced only with force. Before saving,
// the keyspace is compacted at its current revision and defragmented: out holds
// the latest value of every key (with its revisions and lease) and no older
// ones, so values a migration replaced — under a retired key, or in plaintext —
// are not carried over. Every lease of the input is checked to be still there.
func (s *Restored) Save(ctx context.Context, out string, force bool) (err error) {
	if err := CheckOutput(s.Info.Path, out, force); err != nil {
		return err
	}
	if err := s.CheckLeases(ctx, false); err != nil {
		return err
	}
	g, err := s.Client.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return input.Errorf("%s %s: read the revision: %w", input.OutputSnapshot, out, err)
	}
	rev := g.Header.Revision
	if _, err := s.Client.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !etcdscan.IsCompacted(err) {
		return input.Errorf("%s %s: compact at revision %d: %w", input.OutputSnapshot, out, rev, err)
	}
	if _, err := s.Client.Defragment(ctx, s.Client.Endpoints()[0]); err != nil {
		return input.Errorf("%s %s: defragment: %w", input.OutputSnapshot, out, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".new-*")
	if err != nil {
		return input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	// The name is ours; the snapshot creates the file itself (it never replaces one).
	os.Remove(tmpPath)
	defer os.Remove(tmpPath)
	if err := etcdscan.Snapshot(ctx, s.Client, tmpPath); err != nil {
		return input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	if err := keepVersions(tmpPath, Versions{Storage: s.Info.StorageVersion, Cluster: s.Info.ClusterVersion}); err != nil {
		return input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	if err := Publish(tmpPath, out, force); err != nil {
		return input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	return nil
}

// Close stops the keepalives and the private etcd and removes its directory.
func (s *Restored) Close() error {
	s.once.Do(func() {
		if s.stopKA != nil {
			s.stopKA()
		}
		if s.Client != nil {
			s.Client.Close()
		}
		s.kaDone.Wait()
		if s.etcd != nil {
			s.etcd.Close()
		}
		s.closeErr = os.RemoveAll(s.dir)
		openMu.Lock()
		delete(openDirs, s.dir)
		openMu.Unlock()
	})
	return s.closeErr
}

// Dir is the private directory (tests).
func (s *Restored) Dir() string { return s.dir }
