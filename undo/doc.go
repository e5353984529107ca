// Package undo owns the undo of every command that writes to etcd, and the
// checks and guards around those writes: the state directory and its run
// directories (one per writing run: its record, journal, snapshot before the
// first write, plan and summary; the only package that writes them), the
// journal of old values and its reader, rollback (journals read backwards, in
// bounded memory, with a preflight of its own), the preflight every writing
// run passes before its first write (no alarm, no live kube-apiserver, room
// below etcd's quota, room on disk for the undo, working write encryption
// providers), the guard that keeps a run's writes below etcd's quota while it
// writes, and the Store a run writes to.
package undo
