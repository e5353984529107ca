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
	"sigs.k8s.io/yaml"

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
// /etc/kubernetes/manifests, RKE2 into its agent/pod-manifests): etcd.yaml in
// the directory of apiserverManifest, else in its manifests/ or
// pod-manifests/ subdirectory (where it stays when kube-apiserver's manifest
// was moved up out of the kubelet's directory to stop it). The flag is taken
// as etcd takes it (ReadEtcdPod).
func EtcdManifestQuota(apiserverManifest string) (EtcdQuota, error) {
	file, err := EtcdManifestBeside(apiserverManifest)
	if err != nil {
		return EtcdQuota{}, err
	}
	pod, err := ReadEtcdPod(file, "")
	return EtcdQuota{File: file, Bytes: pod.QuotaBytes}, err
}

// EtcdManifestBeside is the etcd static-pod manifest beside kube-apiserver's
// (EtcdManifestQuota says where it is looked for), or ErrNoEtcdManifest.
func EtcdManifestBeside(apiserverManifest string) (string, error) {
	dir := filepath.Dir(apiserverManifest)
	for _, f := range []string{filepath.Join(dir, "etcd.yaml"), filepath.Join(dir, "manifests", "etcd.yaml"), filepath.Join(dir, "pod-manifests", "etcd.yaml")} {
		if _, err := os.Stat(f); err == nil {
			return f, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("etcd manifest %s: %w", f, err)
		}
	}
	return "", ErrNoEtcdManifest
}

// EtcdPod is what the tool reads of etcd's static-pod manifest.
type EtcdPod struct {
	File string
	// QuotaBytes is --quota-backend-bytes, 0 when not set (etcd's default).
	QuotaBytes int64
	// DataDir is --data-dir as a host path (through the pod's hostPath
	// volumes, under the node root), "" when it is not set or under no
	// hostPath volume.
	DataDir string
	// ConfigFile is --config-file as a host path, "" when not given: etcd
	// then takes every setting from that file (RKE2's etcd does).
	ConfigFile string
}

// ReadEtcdPod reads etcd's static-pod manifest file: its settings as etcd
// takes them (etcdManifest.setting). Host paths are read under root ("" or
// "/": this machine's).
func ReadEtcdPod(file, root string) (EtcdPod, error) {
	q := EtcdPod{File: file}
	m, err := readEtcdManifest(file, root)
	if err != nil {
		return q, err
	}
	q.ConfigFile = m.configFile
	if dd, ok := m.setting("data-dir"); ok && dd != "" {
		if host, err := m.mounts.hostPath(dd); err == nil {
			q.DataDir = host
		}
	}
	if val, ok := m.setting("quota-backend-bytes"); ok {
		n, err := strconv.ParseInt(strings.TrimSpace(val), 0, 64)
		if err != nil || n < 0 {
			return q, fmt.Errorf("etcd manifest %s: --quota-backend-bytes %q is not a number of bytes", file, val)
		}
		q.QuotaBytes = n
	}
	return q, nil
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
// its settings taken as etcd takes them (etcdManifest.setting).
func ReadEtcdMember(file string) (EtcdMember, error) {
	em := EtcdMember{File: file}
	m, err := readEtcdManifest(file, "")
	if err != nil {
		return em, err
	}
	em.Name, _ = m.setting("name")
	em.InitialCluster, _ = m.setting("initial-cluster")
	em.InitialAdvertisePeerURLs, _ = m.setting("initial-advertise-peer-urls")
	em.InitialClusterToken, _ = m.setting("initial-cluster-token")
	em.DataDir, _ = m.setting("data-dir")
	if em.DataDir != "" {
		if host, err := m.mounts.hostPath(em.DataDir); err == nil {
			em.HostDataDir = host
		}
	}
	return em, nil
}

// etcdManifest is etcd's container in a static-pod manifest: its command
// line expanded, its environment, its hostPath volumes, and the settings of
// the --config-file it names, if any.
type etcdManifest struct {
	file       string
	args       []string
	env        map[string]string
	mounts     *hostMounts
	configFile string                      // --config-file as a host path
	config     func(string) (string, bool) // its settings; nil without one
}

func readEtcdManifest(file, root string) (*etcdManifest, error) {
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
	if m.mounts, err = newHostMounts(pod, c, root); err != nil {
		return nil, fmt.Errorf("etcd manifest %s: %w", file, err)
	}
	if cf, ok := m.flagOrEnv("config-file"); ok && cf != "" {
		host, err := m.mounts.hostPath(cf)
		if err != nil {
			return nil, fmt.Errorf("etcd manifest %s: --config-file %s: %w", file, cf, err)
		}
		m.configFile = host
		if m.config, err = etcdConfigFile(host); err != nil {
			return nil, fmt.Errorf("etcd manifest %s: --config-file %s: %w", file, cf, err)
		}
	}
	return m, nil
}

// setting is etcd's setting name as etcd takes it: from its --config-file
// when it names one (etcd then ignores its flags and environment), else the
// command line (--name=V or --name V, the last one winning), else its
// ETCD_NAME environment variable.
func (m *etcdManifest) setting(name string) (string, bool) {
	if m.config != nil {
		return m.config(name)
	}
	return m.flagOrEnv(name)
}

func (m *etcdManifest) flagOrEnv(name string) (string, bool) {
	val, found := "", false
	for i, a := range m.args {
		n, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || n != name {
			continue
		}
		if !hasValue && i+1 < len(m.args) && !strings.HasPrefix(m.args[i+1], "-") {
			v = m.args[i+1]
		}
		val, found = v, true
	}
	if !found {
		val, found = m.env["ETCD_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))]
	}
	return val, found
}

// etcdConfigFile reads etcd's YAML configuration file (its keys are the
// flags' names) and returns its settings.
func etcdConfigFile(file string) (func(string) (string, bool), error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("not etcd's YAML configuration: %s", textfmt.OneLine(err.Error()))
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		if !ok || v == nil {
			return "", false
		}
		if f, isNum := v.(float64); isNum {
			return strconv.FormatFloat(f, 'f', -1, 64), true
		}
		return fmt.Sprint(v), true
	}, nil
}
