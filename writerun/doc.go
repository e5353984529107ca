// Package writerun owns a writing run, from the cluster's lock to the record
// of its end: Do takes a command's Stage and does the protocol that makes its
// writes safe in one order (the lock read, the liveness watch started, the
// stage's read-only checks, the run directory made, the stage's writes with
// the lock taken before the snapshot and every journal record durable before
// its write, the finish), for one etcd or each of a cluster kept in several
// (AddEtcd, Ready); and it is where the commands read what runs left behind
// (ListRuns, ClusterRuns, LaterElsewhere, the run's records and errors under
// their names here), so that no command reaches the lock, the undo, the
// guards or the watch but through it.
package writerun
