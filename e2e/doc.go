// Package e2e holds the end-to-end tests: the linked kube-apiserver (1.37) runs in-process
// on an embedded etcd, the tool migrates what it wrote, and every assertion is
// on what kube-apiserver serves afterwards (upgrade with emulated versions,
// key rotation and disaster recovery incl. KMS v2, CRD conversion, events'
// leases, a kube-apiserver started while migrate or rollback writes). The tests
// are in _test.go files; this file only documents them.
package e2e
