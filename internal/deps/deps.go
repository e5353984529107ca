// Package deps pins dependencies while the skeleton is being built. Temporary.
package deps

import (
	_ "github.com/urfave/cli/v2"
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
	_ "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	_ "k8s.io/apiserver/pkg/server/options/encryptionconfig"
	_ "k8s.io/apiserver/pkg/storage/value/encrypt/envelope/testing/v2"
	_ "k8s.io/kubernetes/pkg/api/legacyscheme"
	_ "k8s.io/kubernetes/pkg/controlplane/apiserver/options"
	_ "k8s.io/kubernetes/pkg/kubeapiserver"
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	_ "k8s.io/kube-aggregator/pkg/apis/apiregistration/install"
)
