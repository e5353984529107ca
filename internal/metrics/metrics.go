// Package metrics writes the results of verify and migrate runs as Prometheus
// text-format files for node_exporter's textfile collector (written to a temporary
// file in the same directory, mode 0644, then renamed). The names of the per-resource
// figures follow the upstream kube-storage-version-migrator
// (storage_migrator_core_migrator_*) so existing dashboards keep working; everything
// else is under kube_etcd_migrate_*. Metrics carry resource names and counts only.
package metrics

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/verify"
)

// Metric names.
const (
	// RemainingObjects is upstream's gauge of objects that still need a migration
	// (verify: stale objects; migrate: stale objects not rewritten).
	RemainingObjects = "storage_migrator_core_migrator_remaining_objects"
	// MigratedObjects is upstream's counter of objects migrated (per run here).
	MigratedObjects = "storage_migrator_core_migrator_migrated_objects"

	VerifyObjects       = "kube_etcd_migrate_verify_objects"
	VerifyNotObjects    = "kube_etcd_migrate_verify_not_objects"
	VerifyOrphaned      = "kube_etcd_migrate_verify_orphaned_keys"
	VerifyRevision      = "kube_etcd_migrate_verify_revision"
	VerifyConsistent    = "kube_etcd_migrate_verify_consistent"
	VerifyExitCode      = "kube_etcd_migrate_verify_exit_code"
	VerifyLastRun       = "kube_etcd_migrate_verify_last_run_timestamp_seconds"
	MigrateObjects      = "kube_etcd_migrate_migrate_objects"
	MigrateFailures     = "kube_etcd_migrate_migrate_failures"
	MigrateDuration     = "kube_etcd_migrate_migrate_duration_seconds"
	MigrateLastRun      = "kube_etcd_migrate_migrate_last_run_timestamp_seconds"
	resourceLabel       = "resource"
	statusLabel         = "status"
	verifyCurrentStatus = "current"
)

// BuildInfo is 1, labelled with the tool's version, the Kubernetes release whose
// codecs judged the objects, the VCS revision and the Go version; in every file.
const BuildInfo = "kube_etcd_migrate_build_info"

// now is replaced by tests.
var now = time.Now

// WriteVerify writes a verify report's figures to path: per resource the objects
// current, stale and unreadable, the remaining (stale) objects under upstream's name,
// the scan revision, whether it was consistent, the exit code and the time of the run.
func WriteVerify(path string, rep *verify.Report) error {
	if rep == nil {
		return errors.New("no verify report")
	}
	reg := prometheus.NewRegistry()
	objects := gaugeVec(VerifyObjects, "Objects found by the last verify run, by resource and verdict (current, stale, unreadable).", resourceLabel, statusLabel)
	remaining := gaugeVec(RemainingObjects, "The number of objects that still require migration, labeled with the full resource name (stale objects in the last verify run).", resourceLabel)
	notObjects := gauge(VerifyNotObjects, "Keys under the prefix that are not API objects (health, ...), last verify run.")
	orphaned := gaugeVec(VerifyOrphaned, "Keys no built-in resource or CRD owns (kube-apiserver never reads them), last verify run, by reason (removed-built-in, crd-missing, unknown-prefix).", "reason")
	revision := gauge(VerifyRevision, "etcd revision the last verify run scanned at.")
	consistent := gauge(VerifyConsistent, "1 when the last verify run read every key at one revision, 0 when the revision was compacted during the scan.")
	exitCode := gauge(VerifyExitCode, "Exit code of the last verify run: 0 all current, 3 something stale, 4 something unreadable (or orphaned keys, when the run was told they fail the gate).")
	lastRun := gauge(VerifyLastRun, "Unix time the last verify run finished.")
	reg.MustRegister(objects, remaining, notObjects, orphaned, revision, consistent, exitCode, lastRun, buildInfo())

	for _, r := range rep.Resources {
		name := r.Name()
		objects.WithLabelValues(name, verifyCurrentStatus).Set(float64(r.Current))
		objects.WithLabelValues(name, "stale").Set(float64(r.Stale))
		objects.WithLabelValues(name, "unreadable").Set(float64(r.Unreadable))
		remaining.WithLabelValues(name).Set(float64(r.Stale))
	}
	notObjects.Set(float64(rep.Summary.NotObjects))
	for _, g := range rep.Orphaned {
		orphaned.WithLabelValues(string(g.Reason)).Add(float64(g.Keys))
	}
	revision.Set(float64(rep.Revision))
	consistent.Set(boolFloat(rep.Consistent))
	exitCode.Set(float64(rep.ExitCode()))
	lastRun.Set(float64(now().Unix()))
	return write(path, reg)
}

// MigrateFigures are one resource's figures of a migrate run.
type MigrateFigures struct {
	Resource   string
	Current    int64
	Rewritten  int64
	Conflicts  int64
	Failed     int64
	Unreadable int64
	Stale      int64
}

// WriteMigrate writes a migrate run's figures to path: per resource the objects
// migrated (upstream's counter), the objects by outcome, the failures by kind, the
// stale objects left (upstream's remaining gauge), the run's duration and time.
func WriteMigrate(path string, figs []MigrateFigures, d time.Duration) error {
	reg := prometheus.NewRegistry()
	migrated := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MigratedObjects,
		Help: "The number of objects that have been migrated, labeled with the full resource name (last migrate run).",
	}, []string{resourceLabel})
	remaining := gaugeVec(RemainingObjects, "The number of objects that still require migration, labeled with the full resource name (stale objects the last migrate run did not rewrite).", resourceLabel)
	objects := gaugeVec(MigrateObjects, "Objects of the last migrate run by resource and outcome (current, stale, rewritten, conflict, failed, unreadable).", resourceLabel, statusLabel)
	failures := gaugeVec(MigrateFailures, "Objects the last migrate run could not migrate, by resource and kind (write: the write failed, conflict: the key changed meanwhile, unreadable: left untouched).", resourceLabel, "kind")
	duration := gauge(MigrateDuration, "Duration of the last migrate run in seconds.")
	lastRun := gauge(MigrateLastRun, "Unix time the last migrate run finished.")
	reg.MustRegister(migrated, remaining, objects, failures, duration, lastRun, buildInfo())

	for _, f := range figs {
		if f.Resource == "" {
			return errors.New("migrate figures without a resource name")
		}
		migrated.WithLabelValues(f.Resource).Add(float64(max(f.Rewritten, 0)))
		remaining.WithLabelValues(f.Resource).Set(float64(max(f.Stale-f.Rewritten, 0)))
		for status, n := range map[string]int64{
			"current": f.Current, "stale": f.Stale, "rewritten": f.Rewritten,
			"conflict": f.Conflicts, "failed": f.Failed, "unreadable": f.Unreadable,
		} {
			objects.WithLabelValues(f.Resource, status).Set(float64(n))
		}
		failures.WithLabelValues(f.Resource, "write").Set(float64(f.Failed))
		failures.WithLabelValues(f.Resource, "conflict").Set(float64(f.Conflicts))
		failures.WithLabelValues(f.Resource, "unreadable").Set(float64(f.Unreadable))
	}
	duration.Set(d.Seconds())
	lastRun.Set(float64(now().Unix()))
	return write(path, reg)
}

// buildInfo is the build_info gauge of the running binary.
func buildInfo() prometheus.Collector {
	b := buildinfo.Get()
	g := gaugeVec(BuildInfo, "Always 1: the kube-etcd-migrate build that wrote this file, and the Kubernetes release whose scheme and storage factory it carries.", "version", "kubernetes", "revision", "goversion")
	g.WithLabelValues(b.Version, b.Kubernetes, b.Commit, b.Go).Set(1)
	return g
}

func gauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// write renders the registry into path atomically (temporary file in the same
// directory, mode 0644, rename). The temporary name does not end in ".prom", so
// node_exporter never reads a half-written file.
func write(path string, reg *prometheus.Registry) error {
	if path == "" {
		return errors.New("empty metrics file path")
	}
	if strings.HasSuffix(path, string(filepath.Separator)) {
		return fmt.Errorf("%s is a directory, want a file name", path)
	}
	// The errors of WriteToTextfile are *os.PathError naming the file.
	return prometheus.WriteToTextfile(path, reg)
}
