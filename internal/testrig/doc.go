// Package testrig holds, in its subdirectories, the test rig: real etcd
// servers, older releases' kube-apiservers, KMS plugins, certificates,
// seeded clusters and damaged snapshots for the tests, make demo and make
// bench. Nothing under it is linked into the kube-etcd-migrate binary (a
// test in command checks the binary's imports).
package testrig
