package migrate

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/kubernetes/pkg/apis/coordination"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// DefaultQuotaBackendBytes is etcd's default --quota-backend-bytes.
const DefaultQuotaBackendBytes = 2 << 30

// liveWindow is how recently a kube-apiserver must have renewed a lease to count as live.
const liveWindow = time.Minute

// PreflightError is a refusal before anything was written.
type PreflightError struct{ Msg string }

func (e *PreflightError) Error() string { return "preflight: " + e.Msg + " (nothing was written)" }

// Preflight runs the checks that must pass before the first write and returns a
// line per check passed.
func Preflight(ctx context.Context, env *pipeline.Env, opts Options) ([]string, error) {
	done, err := PreflightOffline(ctx, env, opts)
	if err != nil {
		return done, err
	}

	quota := opts.QuotaBackendBytes
	if quota <= 0 {
		quota = DefaultQuotaBackendBytes
	}
	st, err := etcdscan.Status(ctx, env.Client)
	if err != nil {
		return done, err
	}
	// Every rewrite adds its new value to the database until compaction and
	// defragmentation. All live values together take at most DBSizeInUse, so when
	// even that fits there is no need to count precisely.
	estimate := st.DBSizeInUse
	exact := false
	if st.DBSize+estimate > quota {
		estimate, err = bytesToRewrite(ctx, env)
		if err != nil {
			return done, err
		}
		exact = true
	}
	if st.DBSize+estimate > quota {
		return done, &PreflightError{Msg: fmt.Sprintf("the rewrite would add about %s to a %s database, past the %s quota (--quota-backend-bytes); compact and defragment etcd first ('etcdctl compact', 'etcdctl defrag'), migrate fewer resources at a time (--resource), or raise the quota if etcd runs with a larger one",
			HumanBytes(estimate), HumanBytes(st.DBSize), HumanBytes(quota))}
	}
	how := "at most"
	if exact {
		how = "about"
	}
	done = append(done, fmt.Sprintf("database %s + rewrite %s %s fits the %s quota; compact and defragment afterwards to reclaim it", HumanBytes(st.DBSize), how, HumanBytes(estimate), HumanBytes(quota)))

	grs := env.Storage.BuiltinResources()
	for _, crd := range env.CRDs {
		grs = append(grs, crd.Resource)
	}
	if env.Filter != nil {
		grs = grs[:0]
		for gr := range env.Filter {
			grs = append(grs, gr)
		}
	}
	if err := env.Encryption.Preflight(ctx, grs); err != nil {
		return done, &PreflightError{Msg: "write encryption provider: " + err.Error()}
	}
	done = append(done, "write encryption providers encrypt and decrypt a probe value")
	return done, nil
}

// PreflightOffline runs the checks any write needs (migrate's, quarantine's):
// etcd has no alarm, and no kube-apiserver is alive (unless
// opts.AllowLiveAPIServer, or the etcd is a private copy of a snapshot file
// that no kube-apiserver can reach, opts.PrivateEtcd).
func PreflightOffline(ctx context.Context, env *pipeline.Env, opts Options) ([]string, error) {
	var done []string
	now := time.Now
	if opts.Now != nil {
		now = opts.Now
	}
	alarms, err := etcdscan.Alarms(ctx, env.Client)
	if err != nil {
		return done, err
	}
	if len(alarms) > 0 {
		return done, &PreflightError{Msg: fmt.Sprintf("etcd has active alarms: %s; resolve them (for NOSPACE: compact, defragment, then 'etcdctl alarm disarm')", strings.Join(alarms, "; "))}
	}
	done = append(done, "etcd has no active alarm")

	switch {
	case opts.PrivateEtcd != "":
		done = append(done, "no kube-apiserver can reach this etcd: a private copy of "+opts.PrivateEtcd)
	case !opts.AllowLiveAPIServer:
		live, err := liveAPIServers(ctx, env, now())
		if err != nil {
			return done, err
		}
		if len(live) > 0 {
			seen := make([]string, len(live))
			for i, l := range live {
				seen[i] = l.String()
			}
			return done, &PreflightError{Msg: fmt.Sprintf("a kube-apiserver looks alive: %d lease(s) renewed within the last minute: %s; stop every kube-apiserver first, or pass --allow-live-apiserver", len(live), strings.Join(seen, "; "))}
		}
		done = append(done, "no kube-apiserver lease renewed within the last minute")
	}
	return done, nil
}

// liveLease is a kube-apiserver lease renewed within liveWindow.
type liveLease struct {
	Key  string
	Host string // the lease's kubernetes.io/hostname label, "" when it has none
	Age  time.Duration
}

func (l liveLease) String() string {
	s := fmt.Sprintf("%s renewed %s ago", l.Key, l.Age.Round(time.Second))
	if l.Host != "" {
		s = l.Host + ": " + s
	}
	return s
}

// liveAPIServers lists every kube-apiserver lease (identity leases under
// leases/kube-system/, and master leases) renewed within liveWindow, so that an
// HA control plane's operator sees every node still running one.
func liveAPIServers(ctx context.Context, env *pipeline.Env, now time.Time) ([]liveLease, error) {
	var live []liveLease
	prefix := env.Resolver.Prefix()
	resp, err := env.Client.Get(ctx, prefix+"/leases/kube-system/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("preflight: read %s/leases/kube-system/: %w", prefix, err)
	}
	for _, kv := range resp.Kvs {
		obj, err := env.Decoder.Decode(ctx, etcdscan.KV{Key: string(kv.Key), Value: kv.Value, ModRevision: kv.ModRevision})
		if err != nil {
			continue
		}
		lease, ok := obj.Internal.(*coordination.Lease)
		if !ok || !isAPIServerLease(lease) || lease.Spec.RenewTime == nil {
			continue
		}
		if age := now.Sub(lease.Spec.RenewTime.Time); age < liveWindow {
			live = append(live, liveLease{Key: string(kv.Key), Host: lease.Labels["kubernetes.io/hostname"], Age: age})
		}
	}
	ml, err := env.Client.Get(ctx, prefix+"/masterleases/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("preflight: read %s/masterleases/: %w", prefix, err)
	}
	for _, kv := range ml.Kvs {
		// Master leases carry an etcd lease of about 15 s that the apiserver renews:
		// one that still exists was renewed recently. The key names the apiserver's IP.
		if kv.Lease == 0 {
			continue
		}
		ttl, err := env.Client.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err == nil && ttl.TTL > 0 {
			live = append(live, liveLease{Key: string(kv.Key), Age: time.Duration(ttl.GrantedTTL-ttl.TTL) * time.Second})
		}
	}
	return live, nil
}

func isAPIServerLease(l *coordination.Lease) bool {
	if l.Labels["apiserver.kubernetes.io/identity"] == "kube-apiserver" {
		return true
	}
	return strings.HasPrefix(l.Name, "apiserver-") || strings.HasPrefix(l.Name, "kube-apiserver-")
}

// bytesToRewrite runs the decision over the selected keys and adds up the new values.
func bytesToRewrite(ctx context.Context, env *pipeline.Env) (int64, error) {
	var n int64
	_, err := env.Run(ctx, 0, pipeline.Decide, func(page []reencode.Decision) error {
		for _, d := range page {
			if d.Status == reencode.Stale {
				n += int64(len(d.NewValue))
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("preflight: estimate the rewrite: %w", err)
	}
	return n, nil
}

// HumanBytes prints a size in B, KiB, MiB, ... with one decimal, as the
// preflight and the snapshot report do.
func HumanBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}
