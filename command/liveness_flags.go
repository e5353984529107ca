package command

import (
	"context"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/writerun"
)

// livenessFlags are the flags of the live-apiserver check, for every command
// that writes (migrate, quarantine; rollback and plan as they gain the check).
func livenessFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "allow-live-apiserver", Usage: "write even though etcd shows a kube-apiserver (or another writer) alive: no liveness watch at all, neither the --liveness-window before the first write nor the watch while the run writes (another writer's keys are skipped as compare-and-swap conflicts, never stop the run)"},
		&cli.DurationFlag{Name: "liveness-window", Value: writerun.DefaultWindow, Usage: "watch etcd this long from the start (while the checks, the snapshot and the reading and deciding go on; the first write waits for it): a key written under the prefix meanwhile (a kube-apiserver renews its identity lease every 10s) refuses the run, whatever any clock says; the watch then goes on until the last write, and a write that is not the run's own stops it (exit 5)"},
	}
}

// livenessOptions are livenessFlags as given.
type livenessOptions struct {
	allowLive bool          // --allow-live-apiserver
	window    time.Duration // --liveness-window
}

func newLivenessOptions(c *cli.Context) livenessOptions {
	return livenessOptions{allowLive: c.Bool("allow-live-apiserver"), window: c.Duration("liveness-window")}
}

// validate checks --liveness-window.
func (o livenessOptions) validate() error {
	if o.window <= 0 {
		return usageErr("--liveness-window must be positive (default %s, longer than kube-apiserver's 10s identity-lease renewal)", writerun.DefaultWindow)
	}
	return nil
}

// openToWrite opens the session of a command that writes to etcd, or plans
// to; a writing target's assumed release is warned of.
func openToWrite(ctx context.Context, o *scanOptions) (*session, error) {
	s, err := open(ctx, o)
	if err != nil {
		return nil, err
	}
	if o.target.use == targetWrite {
		warnAssumedRelease(o.io.errOut, s.env)
	}
	return s, nil
}
