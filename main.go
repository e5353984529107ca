// Command kube-etcd-migrate rewrites Kubernetes objects directly in etcd, offline,
// to the storage version and encryption key kube-apiserver would use, and audits
// which objects are stale or unreadable. See README.md and docs/; the command
// line is package command.
package main

import (
	"os"

	"kube-etcd-migrate/command"
)

func main() {
	os.Exit(command.Run(os.Args, os.Stdout, os.Stderr))
}
