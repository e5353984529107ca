package etcdscan

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// KubeadmMetricsURL is where a kubeadm control plane's etcd also serves its
// metrics, in plain HTTP on the node's loopback (its --listen-metrics-urls).
const KubeadmMetricsURL = "http://127.0.0.1:2381"

// Histogram is one of a member's latency distributions, as it serves it
// since it started: how many it observed, their sum, and its buckets.
type Histogram struct {
	Count uint64 `json:"count"`
	// Sum is in seconds (etcd's millisecond histograms are converted).
	Sum float64 `json:"sumSeconds"`
	// buckets are cumulative: observations at most upper seconds.
	buckets []bucket
}

type bucket struct {
	upper float64
	count uint64
}

// Mean is the average observation in seconds (0 when none).
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / float64(h.Count)
}

// Quantile is the upper bound of the bucket that holds the q-th quantile
// (seconds; 0 when nothing was observed; the largest finite bound when it
// lies beyond them).
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 || len(h.buckets) == 0 {
		return 0
	}
	want := uint64(math.Ceil(q * float64(h.Count)))
	for _, b := range h.buckets {
		if b.count >= want && !math.IsInf(b.upper, 1) {
			return b.upper
		}
	}
	return h.buckets[len(h.buckets)-1].upper
}

// add merges o into h (the same buckets: one metric's series of several labels).
func (h *Histogram) add(o Histogram) {
	if len(h.buckets) == 0 {
		h.buckets = append([]bucket(nil), o.buckets...)
	} else if len(h.buckets) == len(o.buckets) {
		for i := range h.buckets {
			h.buckets[i].count += o.buckets[i].count
		}
	}
	h.Count += o.Count
	h.Sum += o.Sum
}

// MemberMetrics is what one member reports of its own costs (its
// Prometheus metrics, read over the client's connection settings): what a
// write, a commit of its backend, a snapshot and a compaction have taken it
// since it started, and its sizes. A histogram that is empty was never
// observed (a member that never compacted, or never sent a snapshot).
type MemberMetrics struct {
	Member string `json:"member"`
	URL    string `json:"url"` // the metrics URL read
	// ID is the member's ID as it serves it (etcd_server_id), 0 when absent
	// (or when the process serves several: embedded members).
	ID uint64 `json:"-"`
	// ids are every ID the process serves.
	ids        []uint64
	QuotaBytes int64 `json:"quotaBytes"`
	DBSize     int64 `json:"dbSize"`
	// DBSizeInUse is what the database's live pages take.
	DBSizeInUse int64 `json:"dbSizeInUse"`
	Keys        int64 `json:"keys"` // keys in its key index
	// Writes are the puts and deletes it applied; Apply the time applying
	// the requests that made them took (etcd_server_apply_duration_seconds
	// of Txn, Put and DeleteRange: each apply, compares included).
	Writes int64     `json:"writes"`
	Apply  Histogram `json:"apply"`
	// WALFsync and BackendCommit: its write-ahead log's fsyncs, its
	// backend's commits (every 100 ms, or 10,000 writes, under writes).
	WALFsync      Histogram `json:"walFsync"`
	BackendCommit Histogram `json:"backendCommit"`
	// Snapshot: each snapshot it sent (etcdctl snapshot save, a backup, a
	// new member's), start to end of the transfer.
	Snapshot Histogram `json:"snapshot"`
	// Compaction: each compaction of its backend, start to end (it walks
	// every revision up to the one compacted at, CompactionBatch at a
	// time); CompactionPause: each batch's hold on the backend.
	Compaction      Histogram `json:"compaction"`
	CompactionPause Histogram `json:"compactionPause"`
	// Compacted is how many revisions its compactions removed.
	Compacted int64 `json:"compactedRevisions"`
}

// Metric names (etcd 3.5 to 3.7).
const (
	metricDBSize      = "etcd_mvcc_db_total_size_in_bytes"
	metricDBSizeOld   = "etcd_debugging_mvcc_db_total_size_in_bytes"
	metricDBInUse     = "etcd_mvcc_db_total_size_in_use_in_bytes"
	metricKeys        = "etcd_debugging_mvcc_keys_total"
	metricPuts        = "etcd_mvcc_put_total"
	metricDeletes     = "etcd_mvcc_delete_total"
	metricApply       = "etcd_server_apply_duration_seconds"
	metricWALFsync    = "etcd_disk_wal_fsync_duration_seconds"
	metricCommit      = "etcd_disk_backend_commit_duration_seconds"
	metricSnapshot    = "etcd_disk_backend_snapshot_duration_seconds"
	metricCompaction  = "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds"
	metricPause       = "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds"
	metricCompactKeys = "etcd_debugging_mvcc_db_compaction_keys_total"
	metricServerID    = "etcd_server_id"
)

// Metrics reads every member's metrics: /metrics on its client URL (over the
// client's TLS configuration), or, when none of those answers, at each of
// fallback (KubeadmMetricsURL: kubeadm's etcd serves them there too) that
// says it is that member (its etcd_server_id). The error names the first
// member none answered for; the result holds those that did.
func Metrics(ctx context.Context, cli *clientv3.Client, fallback ...string) ([]MemberMetrics, error) {
	ms, err := members(ctx, cli)
	if err != nil {
		return nil, err
	}
	cfg := configOf(cli)
	var out []MemberMetrics
	var firstErr error
	for _, m := range ms {
		mm, err := metricsOf(ctx, cfg, m, fallback)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		out = append(out, mm)
	}
	return out, firstErr
}

// metricsOf reads one member's metrics: on its client URLs, else at the
// first of fallback that says it is that member.
func metricsOf(ctx context.Context, cfg clientv3.Config, m member, fallback []string) (MemberMetrics, error) {
	var errs []string
	for _, u := range m.urls {
		fams, shown, err := scrape(ctx, cfg, u)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		return memberMetrics(m.String(), shown, fams), nil
	}
	for _, u := range fallback {
		if m.id == 0 {
			break // nothing to tell it by
		}
		fams, shown, err := scrape(ctx, clientv3.Config{}, u)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		mm := memberMetrics(m.String(), shown, fams)
		if !slices.Contains(mm.ids, m.id) {
			errs = append(errs, fmt.Sprintf("%s: another member's (%x)", shown, mm.ids))
			continue
		}
		mm.ID = m.id
		return mm, nil
	}
	return MemberMetrics{}, fmt.Errorf("%s: %s", m, strings.Join(errs, "; "))
}

// scrape reads the metric families served at /metrics of one endpoint.
func scrape(ctx context.Context, cfg clientv3.Config, endpoint string) (map[string]*dto.MetricFamily, string, error) {
	u, shown, tr, err := metricsURL(cfg, endpoint)
	if err != nil {
		return nil, "", err
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, DefaultCommandTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, shown, fmt.Errorf("%s: %w", shown, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, shown, fmt.Errorf("%s: %w", shown, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil, shown, fmt.Errorf("%s: %s", shown, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, shown, fmt.Errorf("%s: %w", shown, err)
	}
	return families, shown, nil
}

// memberMetrics picks what MemberMetrics holds out of a member's families.
func memberMetrics(member, url string, fams map[string]*dto.MetricFamily) MemberMetrics {
	mm := MemberMetrics{Member: member, URL: url}
	mm.QuotaBytes = int64(gauge(fams[QuotaMetric]))
	mm.DBSize = int64(gauge(fams[metricDBSize]))
	if mm.DBSize == 0 {
		mm.DBSize = int64(gauge(fams[metricDBSizeOld]))
	}
	mm.DBSizeInUse = int64(gauge(fams[metricDBInUse]))
	mm.Keys = int64(gauge(fams[metricKeys]))
	mm.Writes = int64(counter(fams[metricPuts]) + counter(fams[metricDeletes]))
	mm.Apply = histogram(fams[metricApply], 1, func(m *dto.Metric) bool {
		op := label(m, "op")
		return label(m, "version") == "v3" && (op == "Txn" || op == "Put" || op == "DeleteRange")
	})
	mm.WALFsync = histogram(fams[metricWALFsync], 1, nil)
	mm.BackendCommit = histogram(fams[metricCommit], 1, nil)
	mm.Snapshot = histogram(fams[metricSnapshot], 1, nil)
	mm.Compaction = histogram(fams[metricCompaction], 1e-3, nil)
	mm.CompactionPause = histogram(fams[metricPause], 1e-3, nil)
	mm.Compacted = int64(counter(fams[metricCompactKeys]))
	if f := fams[metricServerID]; f != nil {
		for _, m := range f.GetMetric() {
			if id, err := strconv.ParseUint(label(m, "server_id"), 16, 64); err == nil && m.GetGauge().GetValue() == 1 {
				mm.ids = append(mm.ids, id)
			}
		}
		if len(mm.ids) == 1 {
			mm.ID = mm.ids[0]
		}
	}
	return mm
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// gauge is the value of a family's first series (0 when absent).
func gauge(f *dto.MetricFamily) float64 {
	if f == nil || len(f.GetMetric()) == 0 {
		return 0
	}
	m := f.GetMetric()[0]
	if g := m.GetGauge(); g != nil {
		return g.GetValue()
	}
	return m.GetUntyped().GetValue()
}

// counter is the sum of a family's series (0 when absent).
func counter(f *dto.MetricFamily) float64 {
	var v float64
	for _, m := range f.GetMetric() {
		if c := m.GetCounter(); c != nil {
			v += c.GetValue()
		}
	}
	return v
}

// histogram merges the series of a histogram family that keep holds (all
// when nil), scaled by unit to seconds.
func histogram(f *dto.MetricFamily, unit float64, keep func(*dto.Metric) bool) Histogram {
	var h Histogram
	for _, m := range f.GetMetric() {
		hm := m.GetHistogram()
		if hm == nil || (keep != nil && !keep(m)) {
			continue
		}
		one := Histogram{Count: hm.GetSampleCount(), Sum: hm.GetSampleSum() * unit}
		for _, b := range hm.GetBucket() {
			one.buckets = append(one.buckets, bucket{upper: b.GetUpperBound() * unit, count: b.GetCumulativeCount()})
		}
		sort.Slice(one.buckets, func(i, j int) bool { return one.buckets[i].upper < one.buckets[j].upper })
		h.add(one)
	}
	return h
}
