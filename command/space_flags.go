package command

import "github.com/urfave/cli/v2"

// spaceFlags are the flags of etcd's space, for every command that writes to
// a live etcd and keeps its database below the quota (migrate, rollback).
func spaceFlags() []cli.Flag {
	return []cli.Flag{
		&cli.Int64Flag{Name: "quota-backend-bytes", Usage: "etcd's --quota-backend-bytes, when its members' metrics (etcd_server_quota_backend_bytes) do not answer; else etcd's manifest beside --apiserver-manifest; the preflight says which it used"},
		&cli.BoolFlag{Name: "compact-history", Usage: "compact etcd's history up to the run's latest write whenever the database nears the quota, as kube-apiserver's compactor does (the journal is the rollback), so a run that writes more than the free space completes"},
	}
}

// spaceOptions are spaceFlags as given.
type spaceOptions struct {
	quotaBackendBytes int64
	compactHistory    bool
}

func newSpaceOptions(c *cli.Context) spaceOptions {
	return spaceOptions{quotaBackendBytes: c.Int64("quota-backend-bytes"), compactHistory: c.Bool("compact-history")}
}
