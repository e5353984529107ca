package command

import (
	"fmt"
	"strings"

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

func cmdPlan(c *cli.Context) error {
	ctx, stop := signalContext(c.App.ErrWriter)
	defer stop()
	for _, f := range []string{"requested", "record", "snapshot-file", "output-snapshot"} {
		if c.IsSet(f) {
			return usageErr("--%s: plan is for a migrate of the cluster's etcd (see docs/commands.md#plan)", f)
		}
	}
	s, window, err := openToWrite(ctx, c, targetWrite)
	if err != nil {
		return err
	}
	defer s.close()
	stateDir := stateDirOf(c)
	if c.Bool("no-undo") {
		stateDir = ""
	}
	p, err := plan.Run(ctx, s.env, plan.Options{Migrate: migrateOptions(c, ctx, nil, window), StateDir: stateDir})
	if err != nil {
		return err
	}
	for i, b := range p.Blockers {
		if b.Cause != nil {
			p.Blockers[i].Problem = cliMessage(b.Cause)
		}
	}
	if err := printReport(c.App.Writer, c.String("output"), planReport{p}); err != nil {
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
