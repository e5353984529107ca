package command

import (
	"context"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/liveness"
)

// livenessFlags are the flags of the live-apiserver check, for every command
// that writes (migrate, quarantine; rollback and plan as they gain the check).
func livenessFlags() []cli.Flag {
	return []cli.Flag{
		&cli.BoolFlag{Name: "allow-live-apiserver", Usage: "write even though etcd shows a kube-apiserver (or another writer) alive: skips the --liveness-window watch"},
		&cli.DurationFlag{Name: "liveness-window", Value: liveness.DefaultWindow, Usage: "before the first write, watch etcd this long: a key written under the prefix meanwhile (a kube-apiserver renews its identity lease every 10s) refuses the run, whatever any clock says"},
	}
}

// livenessWindow is --liveness-window, checked.
func livenessWindow(c *cli.Context) (time.Duration, error) {
	w := c.Duration("liveness-window")
	if w <= 0 {
		return 0, usageErr("--liveness-window must be positive (default %s, longer than kube-apiserver's 10s identity-lease renewal)", liveness.DefaultWindow)
	}
	return w, nil
}

// openToWrite opens the session of a command that writes to etcd, or plans
// to: --liveness-window checked first (a usage error before any connection),
// then the session; a writing target's assumed release is warned of.
func openToWrite(ctx context.Context, c *cli.Context, use targetUse) (*session, time.Duration, error) {
	window, err := livenessWindow(c)
	if err != nil {
		return nil, 0, err
	}
	s, err := open(ctx, c, use)
	if err != nil {
		return nil, 0, err
	}
	if use == targetWrite {
		warnAssumedRelease(c, s.env)
	}
	return s, window, nil
}
