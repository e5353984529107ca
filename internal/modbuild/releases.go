package modbuild

import "context"

// The releases the tests play beside the ones this module links (go.mod pins
// k8s.io/kubernetes and the etcd client and server): the previous Kubernetes
// release, whose real kube-apiserver writes the cluster the tool upgrades and
// proves an older --target-version, and the previous etcd server minor.
// docs/releasing.md says when to move them.
const (
	PreviousKubernetes = "v1.36.3"
	PreviousEtcd       = "v3.6.16"
)

// Releases are the binaries the tests use, built by `make test` before the
// suite runs (cmd prebuild) and by the first test that needs one otherwise.
func Releases(ctx context.Context) ([]Spec, error) {
	apiserver, err := KubeAPIServer(ctx, PreviousKubernetes)
	if err != nil {
		return nil, err
	}
	return []Spec{apiserver, Etcd(PreviousEtcd), Etcdutl(PreviousEtcd)}, nil
}
