package modbuild

import "context"

// The releases the tests play beside the ones this module links (go.mod pins
// k8s.io/kubernetes and the etcd client and server): the older Kubernetes
// releases the tool targets (--target-version), whose real kube-apiservers
// write the clusters the tool upgrades and prove each older target, and the
// two etcd server minors before the linked one (Kubernetes 1.34..1.37 still
// run on etcd 3.5 and 3.6). docs/releasing.md says when to move them.
const (
	// PreviousKubernetes is the release before the linked one: the cluster
	// TestUpgradeFromPreviousRelease upgrades.
	PreviousKubernetes = "v1.36.3"
	PreviousEtcd       = "v3.6.16"
	OldestEtcd         = "v3.5.35"
)

// OlderKubernetes are the older releases --target-version accepts, newest
// first (PreviousKubernetes first), each at the patch release whose
// kube-apiserver the tests build and whose storage versions and protobuf
// fields internal/build/releasegen generates.
var OlderKubernetes = []string{PreviousKubernetes, "v1.35.4", "v1.34.4"}

// Releases are the binaries the tests use, built by `make test` before the
// suite runs (cmd prebuild) and by the first test that needs one otherwise.
func Releases(ctx context.Context) ([]Spec, error) {
	var specs []Spec
	for _, release := range OlderKubernetes {
		apiserver, err := KubeAPIServer(ctx, release)
		if err != nil {
			return nil, err
		}
		specs = append(specs, apiserver)
	}
	return append(specs, Etcd(PreviousEtcd), Etcdutl(PreviousEtcd), Etcd(OldestEtcd), Etcdutl(OldestEtcd)), nil
}
