// Package guard holds the checks and guards around a writing run's writes,
// apart from the undo they protect (package undo): the preflight every
// writing run passes before its first write (no alarm, no live
// kube-apiserver, room below etcd's quota, room on disk for the undo and
// etcd's own growth, working write encryption providers; a rollback's own
// checks), the liveness watch for the whole run and the first write
// (FirstWrite: the run's lock, the snapshot saved while the window ends, the
// window's verdict), the space guard that keeps a run's writes below etcd's
// quota while it writes (compacting as it goes when asked), and where a run's
// writes go and wait (the Store, the Spool that holds what a run decided
// while its first write waits, the Backlog that queues what its writers have
// no room for yet).
package guard
