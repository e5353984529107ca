package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/metrics"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/storagemigration"
	"kube-etcd-migrate/verify"
)

// migrateOptions are the write options of the migrate command's flags.
func migrateOptions(c *cli.Context, writeCtx context.Context) migrate.Options {
	return migrate.Options{
		DryRun:             c.Bool("dry-run"),
		FailFast:           c.Bool("fail-fast"),
		Journal:            c.String("journal"),
		Snapshot:           c.String("snapshot"),
		AllowLiveAPIServer: c.Bool("allow-live-apiserver"),
		QuotaBackendBytes:  c.Int64("quota-backend-bytes"),
		CompactHistory:     c.Bool("compact-history"),
		BatchOps:           c.Int("batch-ops"),
		BatchBytes:         c.Int("batch-bytes"),
		Writers:            c.Int("writers"),
		WriteContext:       writeCtx,
		PrivateEtcd:        c.String("snapshot-file"),
	}
}

// cmdMigrateRequested is 'migrate --requested'.
func cmdMigrateRequested(ctx context.Context, c *cli.Context, s *session) error {
	if c.Bool("record") {
		return usageErr("--requested and --record: the requests record their own outcome; give one of them")
	}
	if len(c.StringSlice("resource")) > 0 || c.String("namespace") != "" {
		return usageErr("--requested: the requests name their resources; --resource and --namespace do not apply")
	}
	if c.String("snapshot-file") != "" {
		return usageErr("--requested works on the cluster's etcd, not on --snapshot-file (an output snapshot must be current in every resource, a request migrates one)")
	}
	writeCtx, cancelWrites := context.WithCancel(context.Background())
	defer cancelWrites()
	res, runErr := storagemigration.RunRequested(ctx, s.env, storagemigration.Options{Migrate: migrateOptions(c, writeCtx)})
	if res != nil {
		write := func(w io.Writer, format string) error {
			if format == "json" {
				return writeJSON(w, res)
			}
			return res.WriteTable(w)
		}
		if err := writeReport(c.App.Writer, c.String("output"), write); err != nil {
			return err
		}
	}
	if p := c.String("metrics-file"); p != "" && res != nil && !res.DryRun {
		if err := metrics.WriteMigrate(p, requestFigures(res), requestsDuration(res)); err != nil {
			return fmt.Errorf("--metrics-file %s: %w", p, err)
		}
	}
	if runErr != nil {
		return runErr
	}
	unreadable := false
	for _, o := range res.Requests {
		if o.Result == storagemigration.ResultLeftRunning {
			return &codeError{code: exitError, err: fmt.Errorf("request %s: %s", o.Name, o.Message)}
		}
		if o.Migration != nil && o.Migration.Summary.Unreadable > 0 {
			unreadable = true
		}
	}
	if unreadable {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("unreadable object(s) left untouched: the requests of their resources are Failed")}
	}
	return nil
}

// requestFigures are the metrics of the requests' migrations, per resource:
// a resource migrated by several requests adds up what was found stale and
// written; current and unreadable are the last run's.
func requestFigures(res *storagemigration.Result) []metrics.MigrateFigures {
	var out []metrics.MigrateFigures
	at := map[string]int{}
	for _, o := range res.Requests {
		if o.Migration == nil {
			continue
		}
		for _, f := range migrateFigures(o.Migration) {
			i, ok := at[f.Resource]
			if !ok {
				at[f.Resource] = len(out)
				out = append(out, f)
				continue
			}
			g := &out[i]
			g.Current, g.Rewritten, g.Conflicts = f.Current, g.Rewritten+f.Rewritten, g.Conflicts+f.Conflicts
			g.Failed, g.Unreadable, g.Stale = g.Failed+f.Failed, f.Unreadable, g.Stale+f.Stale
		}
	}
	return out
}

func requestsDuration(res *storagemigration.Result) time.Duration {
	var d time.Duration
	for _, o := range res.Requests {
		if o.Migration != nil {
			d += o.Migration.Duration
		}
	}
	return d
}

// checkRecord refuses --record, before anything is written, when the target
// kube-apiserver would not serve the records.
func checkRecord(c *cli.Context, env *pipeline.Env) error {
	if !c.Bool("record") {
		return nil
	}
	served, why, err := storagemigration.Serving(env)
	if err != nil {
		return err
	}
	if !served {
		return &codeError{code: exitError, err: fmt.Errorf("--record: %s; nothing was written", why)}
	}
	return nil
}

// recordMigration writes the records of a finished migration (--record).
func recordMigration(ctx context.Context, c *cli.Context, env *pipeline.Env, sum *migrate.Summary, runErr error, started time.Time, writeCtx context.Context) ([]storagemigration.Recorded, error) {
	if !c.Bool("record") || sum == nil {
		return nil, nil
	}
	if sum.DryRun {
		var out []storagemigration.Recorded
		for _, r := range sum.Resources {
			if r.Stale > 0 {
				gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
				out = append(out, storagemigration.Recorded{Name: storagemigration.RecordName(started, gr), Group: r.Group, Resource: r.Resource, Result: "would-record"})
			}
		}
		return out, nil
	}
	if runErr != nil {
		return nil, fmt.Errorf("--record: the migration did not finish: no record was written")
	}
	recs, err := storagemigration.Record(ctx, env, sum, started, migrateOptions(c, writeCtx), nil)
	if err != nil {
		return recs, fmt.Errorf("--record: %w", err)
	}
	return recs, nil
}

// writeMigrateReport is migrate's summary, with the records written.
func writeMigrateReport(w io.Writer, sum *migrate.Summary, recs []storagemigration.Recorded, format string) error {
	if recs == nil {
		return writeSummary(w, sum, format)
	}
	if format == "json" {
		return writeReport(w, format, func(w io.Writer, _ string) error {
			return writeJSON(w, struct {
				*migrate.Summary
				Records []storagemigration.Recorded `json:"records"`
			}{sum, recs})
		})
	}
	if err := writeSummary(w, sum, format); err != nil {
		return err
	}
	if len(recs) == 0 {
		_, err := fmt.Fprintln(w, "record: no resource was rewritten, so no StorageVersionMigration was written")
		return err
	}
	for _, r := range recs {
		gr := schema.GroupResource{Group: r.Group, Resource: r.Resource}
		line := fmt.Sprintf("record %s (%s): %s", r.Name, gr, r.Result)
		if r.Message != "" {
			line += ": " + r.Message
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// verifyWithRequests writes the verify report followed by the pending
// StorageVersionMigration requests (a "storageVersionMigrations" member in
// JSON and YAML); plan nil: the report alone.
func verifyWithRequests(rep *verify.Report, plan *storagemigration.Plan) func(io.Writer, string) error {
	if plan == nil {
		return rep.Write
	}
	return func(w io.Writer, format string) error {
		if format != "json" {
			if err := rep.Write(w, format); err != nil {
				return err
			}
			return plan.WriteTable(w)
		}
		var buf bytes.Buffer
		if err := rep.Write(&buf, "json"); err != nil {
			return err
		}
		body := bytes.TrimSpace(buf.Bytes())
		if len(body) < 2 || body[len(body)-1] != '}' {
			return fmt.Errorf("verify report is not a JSON object")
		}
		member, err := json.Marshal(plan)
		if err != nil {
			return err
		}
		merged := append(bytes.TrimSpace(body[:len(body)-1]), []byte(`,"storageVersionMigrations":`)...)
		merged = append(append(merged, member...), '}')
		var out bytes.Buffer
		if err := json.Indent(&out, merged, "", "  "); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err = w.Write(out.Bytes())
		return err
	}
}
