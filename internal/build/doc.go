// Package build holds, in its subdirectories, the tools that build what the
// tests and the generated tables need: modbuild (another release's binaries
// from its own module) and releasegen (release/zz_generated_releases.go and
// the every-resource stubs, asked of each older release's own code). They
// run with go run; nothing under it is linked into the kube-etcd-migrate
// binary.
package build
