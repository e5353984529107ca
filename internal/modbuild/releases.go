package modbuild

import "context"

// The releases the tests play beside the ones this module links (go.mod pins
// k8s.io/kubernetes and the etcd client and server): the previous Kubernetes
// release, whose real kube-apiserver writes the cluster the tool upgrades and
// proves an older --target-version, and the two etcd server minors before the
// linked one (Kubernetes 1.34..1.37 still run on etcd 3.5 and 3.6).
// docs/releasing.md says when to move them.
const (
	PreviousKubernetes = "v1.36.3"
	PreviousEtcd       = "v3.6.16"
	OldestEtcd         = "v3.5.35"
)

// Releases are the binaries the tests use, built by `make test` before the
// suite runs (cmd prebuild) and by the first test that needs one otherwise.
func Releases(ctx context.Context) ([]Spec, error) {
	apiserver, err := KubeAPIServer(ctx, PreviousKubernetes)
	if err != nil {
		return nil, err
	}
	return []Spec{apiserver, Etcd(PreviousEtcd), Etcdutl(PreviousEtcd), Etcd(OldestEtcd), Etcdutl(OldestEtcd)}, nil
}
