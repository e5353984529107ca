// Package runbooks holds the tests that run docs/runbooks.md's own shell
// steps: each installer's stop_apiserver and start_apiserver, extracted from
// the page as written, run by bash against a node laid out under a scratch
// root and a real etcd configured as that installer configures it. It has
// no code of its own.
package runbooks
