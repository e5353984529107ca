package etcdscan

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MemberStatus is one member's answer to Status.
type MemberStatus struct {
	Name        string `json:"name"`
	ID          uint64 `json:"id"`
	Endpoint    string `json:"endpoint"` // the client URL that answered
	DBSize      int64  `json:"dbSize"`
	DBSizeInUse int64  `json:"dbSizeInUse"`
}

// member is a member of the cluster and the client URLs to ask it on.
type member struct {
	name string
	id   uint64
	urls []string
}

// members lists the cluster's members with their client URLs. A cluster of
// one member is asked through the client's own endpoints (a member on a unix
// socket, or behind an address it does not advertise, has no usable URL); a
// larger one through each member's
// advertised client URLs, so that every member is seen whatever endpoints
// the tool was given (kubeadm's kube-apiserver names only its own node's).
func members(ctx context.Context, cli *clientv3.Client) ([]member, error) {
	cctx, cancel := context.WithTimeout(ctx, DefaultCommandTimeout)
	resp, err := cli.MemberList(cctx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("etcd member list: %w", err)
	}
	if len(resp.Members) <= 1 {
		m := member{urls: cli.Endpoints()}
		if len(resp.Members) == 1 {
			m.name, m.id = resp.Members[0].Name, resp.Members[0].ID
		}
		return []member{m}, nil
	}
	out := make([]member, 0, len(resp.Members))
	for _, m := range resp.Members {
		if len(m.ClientURLs) == 0 {
			continue // a learner not started yet: nothing stored there yet
		}
		out = append(out, member{name: m.Name, id: m.ID, urls: m.ClientURLs})
	}
	return out, nil
}

func (m member) String() string {
	if m.name != "" {
		return fmt.Sprintf("member %s (%x)", m.name, m.id)
	}
	return "member " + strings.Join(m.urls, ",")
}

// Compact compacts etcd's history up to rev (the revisions below it can no
// longer be read; the current value of every key stays) and waits until the
// members have removed the old revisions from their backends
// (WithCompactPhysical), so that their pages are free for later writes. This
// is what kube-apiserver's compactor does every five minutes.
func Compact(ctx context.Context, cli *clientv3.Client, rev int64) error {
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return fmt.Errorf("etcd compact at revision %d: %w", rev, err)
	}
	return nil
}

// CompactTaken says whether etcd has taken a compaction at rev (or later):
// it refuses to read the revision below it. etcd takes a compaction when
// its members apply it and only then removes the old revisions from their
// backends, in batches, which for millions of revisions takes minutes; the
// compaction goes on there whatever becomes of the client that asked it.
func CompactTaken(ctx context.Context, cli *clientv3.Client, rev int64) (bool, error) {
	if rev <= 1 {
		return true, nil
	}
	// One key (whether it exists does not matter): etcd checks the
	// revision before it looks.
	_, err := cli.Get(ctx, compactProbeKey, clientv3.WithRev(rev-1), clientv3.WithCountOnly())
	switch {
	case err == nil:
		return false, nil
	case errors.Is(err, rpctypes.ErrCompacted):
		return true, nil
	default:
		return false, fmt.Errorf("etcd compaction at revision %d: %w", rev, err)
	}
}

// compactProbeKey is the key CompactTaken reads.
const compactProbeKey = "/registry/"

// QuotaMetric is the name of the gauge every etcd member serves with its
// --quota-backend-bytes.
const QuotaMetric = "etcd_server_quota_backend_bytes"

// MemberQuota is one member's configured quota as its metrics say.
type MemberQuota struct {
	Member string
	URL    string // the metrics URL read
	Bytes  int64
}

// Quotas reads etcd_server_quota_backend_bytes from every member's metrics
// endpoint: /metrics on the member's client URL (etcd serves it there unless
// --listen-metrics-urls moved it), over the client's TLS configuration. The
// error names the first member that did not answer; quotas holds those that did.
func Quotas(ctx context.Context, cli *clientv3.Client) ([]MemberQuota, error) {
	ms, err := members(ctx, cli)
	if err != nil {
		return nil, err
	}
	cfg := configOf(cli)
	var out []MemberQuota
	var firstErr error
	for _, m := range ms {
		var errs []string
		found := false
		for _, u := range m.urls {
			q, murl, err := metricsQuota(ctx, cfg, u)
			if err != nil {
				errs = append(errs, err.Error())
				continue
			}
			out = append(out, MemberQuota{Member: m.String(), URL: murl, Bytes: q})
			found = true
			break
		}
		if !found && firstErr == nil {
			firstErr = fmt.Errorf("%s: %s", m, strings.Join(errs, "; "))
		}
	}
	return out, firstErr
}

// metricsQuota reads the quota gauge from the /metrics of one client URL.
func metricsQuota(ctx context.Context, cfg clientv3.Config, endpoint string) (int64, string, error) {
	families, shown, err := scrape(ctx, cfg, endpoint)
	if err != nil {
		return 0, shown, err
	}
	fam := families[QuotaMetric]
	if fam == nil || len(fam.GetMetric()) == 0 || fam.GetMetric()[0].GetGauge() == nil {
		return 0, shown, fmt.Errorf("%s: no %s", shown, QuotaMetric)
	}
	v := fam.GetMetric()[0].GetGauge().GetValue()
	if v <= 0 {
		return 0, shown, fmt.Errorf("%s: %s is %v", shown, QuotaMetric, v)
	}
	return int64(v), shown, nil
}

// metricsURL turns a client endpoint (etcdctl forms: host:port, http(s)://,
// unix://) into the URL of its /metrics, how to name it, and a transport
// that reaches it.
func metricsURL(cfg clientv3.Config, endpoint string) (string, string, *http.Transport, error) {
	tr := &http.Transport{TLSClientConfig: cfg.TLS, DisableKeepAlives: true}
	if !strings.Contains(endpoint, "://") {
		scheme := "http"
		if cfg.TLS != nil {
			scheme = "https"
		}
		endpoint = scheme + "://" + endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", "", nil, fmt.Errorf("endpoint %s: %w", endpoint, err)
	}
	switch u.Scheme {
	case "http", "https":
		m := u.Scheme + "://" + u.Host + "/metrics"
		return m, m, tr, nil
	case "unix":
		sock := u.Host + u.Path
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", sock)
		}
		return "http://localhost/metrics", "/metrics on unix socket " + sock, tr, nil
	}
	return "", "", nil, fmt.Errorf("endpoint %s: scheme %q", endpoint, u.Scheme)
}

// statusTimeout bounds one member's Status request.
const statusTimeout = 5 * time.Second
