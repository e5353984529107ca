package target

import (
	"context"
	"fmt"
	"strings"

	api "k8s.io/kubernetes/pkg/apis/core"
	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
)

// KubeadmConfigKey is where kubeadm keeps its ClusterConfiguration: the
// ConfigMap kube-system/kubeadm-config, under the etcd prefix.
func KubeadmConfigKey(prefix string) string {
	return strings.TrimSuffix(prefix, "/") + "/configmaps/kube-system/kubeadm-config"
}

// ClusterRelease reads the Kubernetes release a kubeadm cluster says it runs:
// kubernetesVersion of the ClusterConfiguration in kubeadm's kubeadm-config
// ConfigMap, decrypted and decoded as kube-apiserver reads it. It returns ""
// with no error when there is no such ConfigMap (not a kubeadm cluster), and
// an error naming the key when it is there but cannot be read.
func ClusterRelease(ctx context.Context, src etcdscan.Source, prefix string, enc *encryption.Transformers) (string, error) {
	key := KubeadmConfigKey(prefix)
	rctx, cancel := context.WithTimeout(ctx, etcdscan.DefaultScanCommandTimeout)
	defer cancel()
	kv, found, err := src.Get(rctx, key, 0)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", key, err)
	}
	if !found {
		return "", nil
	}
	return kubeadmRelease(ctx, kv, prefix, enc)
}

// kubeadmRelease is the release the kubeadm-config ConfigMap kv says: its
// value decrypted and decoded as kube-apiserver reads it, then
// kubernetesVersion of the ClusterConfiguration it holds; "" when it holds
// none. An error names the key.
func kubeadmRelease(ctx context.Context, kv etcdscan.KV, prefix string, enc *encryption.Transformers) (string, error) {
	key := kv.Key
	storage, err := decode.NewStorageConfig("")
	if err != nil {
		return "", err
	}
	dec := decode.NewDecoder(decode.NewResolver(prefix, storage), storage, enc)
	obj, err := dec.Decode(ctx, kv)
	if err != nil {
		return "", fmt.Errorf("kubeadm's ClusterConfiguration: %w", err)
	}
	cm, ok := obj.Internal.(*api.ConfigMap)
	if !ok {
		return "", fmt.Errorf("%s: not a ConfigMap", key)
	}
	raw, ok := cm.Data["ClusterConfiguration"]
	if !ok {
		return "", nil
	}
	// Only kubernetesVersion is read; kubeadm writes it in every
	// ClusterConfiguration version (v1beta3, v1beta4).
	var cc struct {
		KubernetesVersion string `json:"kubernetesVersion"`
	}
	if err := yaml.Unmarshal([]byte(raw), &cc); err != nil {
		return "", fmt.Errorf("%s: ClusterConfiguration: %v", key, err)
	}
	return cc.KubernetesVersion, nil
}
