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
	file, err := EtcdManifestBeside(apiserverManifest)
	if err != nil {
		return EtcdQuota{}, err
	}
	q := EtcdQuota{File: file}
	m, err := readEtcdManifest(file)
	if err != nil {
		return q, err
	}
	val, found := m.flag("quota-backend-bytes")
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

// EtcdManifestBeside is the etcd static-pod manifest beside kube-apiserver's
// (EtcdManifestQuota says where it is looked for), or ErrNoEtcdManifest.
func EtcdManifestBeside(apiserverManifest string) (string, error) {
	dir := filepath.Dir(apiserverManifest)
	for _, f := range []string{filepath.Join(dir, "etcd.yaml"), filepath.Join(dir, "manifests", "etcd.yaml")} {
		if _, err := os.Stat(f); err == nil {
			return f, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("etcd manifest %s: %w", f, err)
		}
	}
	return "", ErrNoEtcdManifest
}

// EtcdMember is the etcd member a static-pod manifest runs, as an etcd
// snapshot restore on its node needs it: the flags kubeadm gives a stacked
// etcd member, each "" when the manifest does not set it.
type EtcdMember struct {
	File string // the etcd manifest read
	// Name is --name; InitialCluster --initial-cluster (NAME=PEER_URL,...:
	// the members known when this one joined); InitialAdvertisePeerURLs
	// --initial-advertise-peer-urls; InitialClusterToken
	// --initial-cluster-token.
	Name, InitialCluster, InitialAdvertisePeerURLs, InitialClusterToken string
	// DataDir is --data-dir as etcd sees it in its container; HostDataDir
	// the same directory on the host, through the pod's hostPath volumes
	// ("" when none is mounted at or above it: then it is not on the host).
	DataDir, HostDataDir string
}

// ReadEtcdMember reads the member an etcd static-pod manifest (file) runs,
// its flags taken as etcd takes them (the command line after the kubelet's
// $(VAR) expansion, else the ETCD_* environment variable). A manifest whose
// etcd reads a --config-file is an error: the flags are in that file.
func ReadEtcdMember(file string) (EtcdMember, error) {
	em := EtcdMember{File: file}
	m, err := readEtcdManifest(file)
	if err != nil {
		return em, err
	}
	em.Name, _ = m.flag("name")
	em.InitialCluster, _ = m.flag("initial-cluster")
	em.InitialAdvertisePeerURLs, _ = m.flag("initial-advertise-peer-urls")
	em.InitialClusterToken, _ = m.flag("initial-cluster-token")
	em.DataDir, _ = m.flag("data-dir")
	if em.DataDir != "" && m.mounts != nil {
		if host, err := m.mounts.hostPath(em.DataDir); err == nil {
			em.HostDataDir = host
		}
	}
	return em, nil
}

// etcdManifest is etcd's container in a static-pod manifest: its command
// line expanded, its environment, its hostPath volumes.
type etcdManifest struct {
	file   string
	args   []string
	env    map[string]string
	mounts *hostMounts
}

func readEtcdManifest(file string) (*etcdManifest, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("etcd manifest %s: %w", file, err)
	}
	obj, _, err := manifestCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("etcd manifest %s: not a Pod manifest: %s", file, textfmt.OneLine(err.Error()))
	}
	pod := &corev1.Pod{}
	if err := legacyscheme.Scheme.Convert(obj, pod, nil); err != nil {
		return nil, fmt.Errorf("etcd manifest %s: not a Pod manifest (%s)", file, obj.GetObjectKind().GroupVersionKind().Kind)
	}
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "etcd" || len(pod.Spec.Containers) == 1 {
			c = &pod.Spec.Containers[i]
			break
		}
	}
	if c == nil {
		return nil, fmt.Errorf("etcd manifest %s: no container named etcd", file)
	}
	m := &etcdManifest{file: file, env: map[string]string{}}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			m.env[e.Name] = expansion.Expand(e.Value, expansion.MappingFuncFor(m.env))
		}
	}
	mapping := expansion.MappingFuncFor(m.env)
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		m.args = append(m.args, expansion.Expand(a, mapping))
	}
	for _, a := range m.args {
		name, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "config-file" {
			return nil, fmt.Errorf("etcd manifest %s: etcd reads --config-file %s, which the tool does not read", file, v)
		}
	}
	if m.mounts, err = newHostMounts(pod, c); err != nil {
		return nil, fmt.Errorf("etcd manifest %s: %w", file, err)
	}
	return m, nil
}

// flag is etcd's flag name as its command line sets it (--name=V or
// --name V, the last one winning), else its ETCD_NAME environment variable.
func (m *etcdManifest) flag(name string) (string, bool) {
	val, found := "", false
	for i, a := range m.args {
		n, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || n != name {
			continue
		}
		if !hasValue && i+1 < len(m.args) {
			v = m.args[i+1]
		}
		val, found = v, true
	}
	if !found {
		val, found = m.env["ETCD_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))]
	}
	return val, found
}
