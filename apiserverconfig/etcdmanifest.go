package apiserverconfig

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
	"kube-etcd-migrate/internal/textfmt"
)

// EtcdQuota is etcd's --quota-backend-bytes as its static-pod manifest sets it.
type EtcdQuota struct {
	File  string // the etcd manifest read
	Bytes int64  // 0 when the manifest does not set it (etcd's default applies)
}

// ErrNoEtcdManifest: no etcd manifest beside kube-apiserver's.
var ErrNoEtcdManifest = errors.New("no etcd static-pod manifest beside kube-apiserver's")

// EtcdManifestQuota reads etcd's --quota-backend-bytes from the etcd
// static-pod manifest beside kube-apiserver's (kubeadm writes both into
// /etc/kubernetes/manifests): etcd.yaml in the directory of apiserverManifest,
// else in its manifests/ subdirectory (where it stays when kube-apiserver's
// manifest was moved up out of the kubelet's directory to stop it). The flag
// is taken as etcd takes it: --quota-backend-bytes=N or --quota-backend-bytes N
// on the command line (after the kubelet's $(VAR) expansion), else the
// ETCD_QUOTA_BACKEND_BYTES environment variable. A manifest whose etcd reads
// a --config-file is an error: the quota is in that file.
func EtcdManifestQuota(apiserverManifest string) (EtcdQuota, error) {
	dir := filepath.Dir(apiserverManifest)
	var file string
	for _, f := range []string{filepath.Join(dir, "etcd.yaml"), filepath.Join(dir, "manifests", "etcd.yaml")} {
		if _, err := os.Stat(f); err == nil {
			file = f
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return EtcdQuota{}, fmt.Errorf("etcd manifest %s: %w", f, err)
		}
	}
	if file == "" {
		return EtcdQuota{}, ErrNoEtcdManifest
	}
	q := EtcdQuota{File: file}
	data, err := os.ReadFile(file)
	if err != nil {
		return q, fmt.Errorf("etcd manifest %s: %w", file, err)
	}
	obj, _, err := manifestCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return q, fmt.Errorf("etcd manifest %s: not a Pod manifest: %s", file, textfmt.OneLine(err.Error()))
	}
	pod := &corev1.Pod{}
	if err := legacyscheme.Scheme.Convert(obj, pod, nil); err != nil {
		return q, fmt.Errorf("etcd manifest %s: not a Pod manifest (%s)", file, obj.GetObjectKind().GroupVersionKind().Kind)
	}
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "etcd" || len(pod.Spec.Containers) == 1 {
			c = &pod.Spec.Containers[i]
			break
		}
	}
	if c == nil {
		return q, fmt.Errorf("etcd manifest %s: no container named etcd", file)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expansion.Expand(e.Value, expansion.MappingFuncFor(env))
		}
	}
	mapping := expansion.MappingFuncFor(env)
	var args []string
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		args = append(args, expansion.Expand(a, mapping))
	}
	val, found := "", false
	for i, a := range args {
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		switch name {
		case "config-file":
			return q, fmt.Errorf("etcd manifest %s: etcd reads --config-file %s, which the tool does not read", file, v)
		case "quota-backend-bytes":
			if !hasValue && i+1 < len(args) {
				v = args[i+1]
			}
			val, found = v, true
		}
	}
	if !found {
		val, found = env["ETCD_QUOTA_BACKEND_BYTES"]
	}
	if !found {
		return q, nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(val), 0, 64)
	if err != nil || n < 0 {
		return q, fmt.Errorf("etcd manifest %s: --quota-backend-bytes %q is not a number of bytes", file, val)
	}
	q.Bytes = n
	return q, nil
}
