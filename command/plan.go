package command

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/plan"
)

func planCommand() *cli.Command {
	return &cli.Command{
		Name:  "plan",
		Usage: "read-only, kube-apiserver still up: everything migrate (with the same flags) would check before its first write except liveness, one line per blocker with its remedy, whether the undo would fit below etcd's quota, and an estimate of the outage",
		// The migrate command's flags, so that the plan is the same command
		// line with another verb.
		Flags:        migrateCommand().Flags,
		Action:       cmdPlan,
		OnUsageError: commandUsageError,
	}
}

// planOptions are plan's flags: migrate's, of which it refuses those
// given (given) that are not for a migrate of the cluster's etcd.
type planOptions struct {
	*migrateOptions
	given []string
}

func newPlanOptions(c *cli.Context) *planOptions {
	o := &planOptions{migrateOptions: newMigrateOptions(c)}
	for _, f := range []string{"requested", "record", "snapshot-file", "output-snapshot"} {
		if c.IsSet(f) {
			o.given = append(o.given, f)
		}
	}
	return o
}

// validate refuses, before anything is opened, what plan's flags alone refuse.
func (o *planOptions) validate() error {
	if len(o.given) > 0 {
		return usageErr("--%s: plan is for a migrate of the cluster's etcd (see docs/commands.md#plan)", o.given[0])
	}
	if err := o.live.validate(); err != nil {
		return err
	}
	return o.scan.validate()
}

func cmdPlan(c *cli.Context) error {
	o := newPlanOptions(c)
	if err := o.validate(); err != nil {
		return err
	}
	ctx, stop := signalContext(o.scan.io.errOut)
	defer stop()
	return o.runPlan(ctx, startedAt(c))
}

// runPlan is the plan command, its options validated.
func (o *planOptions) runPlan(ctx context.Context, started time.Time) error {
	es, err := o.scan.clusterEtcds(o.scan.io.errOut)
	if err != nil {
		return err
	}
	if es.Split() {
		return o.runPlanEtcds(ctx, es, started)
	}
	s, err := openToWrite(ctx, o.scan)
	if err != nil {
		return err
	}
	defer s.close()
	stateDir := o.undo.stateDir
	if o.undo.noUndo {
		stateDir = ""
	}
	// A SQLite datastore is read from plan's private copy of it, which plan
	// may write to time migrate's writes; the node's file is never served
	// to plan (nor is a PostgreSQL database: plan writes nothing there).
	var sqliteCopy *plan.SQLiteCopy
	if k := s.kine; k != nil && !k.write && k.srv.SQLite() && k.srv.Private {
		sqliteCopy = &plan.SQLiteCopy{Copied: k.srv.Copied, Copy: k.srv.Database, Datastore: k.srv.Name()}
	}
	p, err := plan.Run(ctx, s.env, plan.Options{Migrate: o.runOptions(ctx, nil), StateDir: stateDir, Started: started, SQLiteCopy: sqliteCopy})
	if err != nil {
		return err
	}
	for i, b := range p.Blockers {
		if b.Cause != nil {
			p.Blockers[i].Problem = cliMessage(b.Cause)
		}
	}
	if err := printReport(o.scan.io.out, o.output, planReport{p}); err != nil {
		return err
	}
	if !p.Proceeds() {
		problems := make([]string, len(p.Blockers))
		for i, b := range p.Blockers {
			problems[i] = b.Check
		}
		return &codeError{code: exitError, err: fmt.Errorf("migrate would refuse: %d blocker(s) (%s); each is listed above with its remedy", len(p.Blockers), strings.Join(problems, ", "))}
	}
	if p.Summary.Unreadable > 0 {
		return &codeError{code: exitUnreadable, err: fmt.Errorf("%d unreadable object(s): migrate would leave them untouched and exit 4", p.Summary.Unreadable)}
	}
	return nil
}
