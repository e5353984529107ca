package apiserverconfig

import (
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	kmsutil "k8s.io/kms/pkg/util"

	"kube-etcd-migrate/internal/input"
)

// KMSEndpointMapper returns the function that maps the KMS plugin endpoints
// written in the encryption configuration at path to the endpoints the tool
// dials (for encryption.Options.MapKMSEndpoint), or nil when there is
// nothing to map: path is not the manifest's --encryption-provider-config (the
// tool's own flag overrode it, or it came from a flags file: host paths). In a
// manifest's encryption configuration, a KMS endpoint is a socket path inside
// kube-apiserver's container; the function maps it through the pod's hostPath
// volumes as it maps the manifest's own paths, so the tool reaches the plugin
// where kube-apiserver does. An installer's command line (Input.CommandLine)
// read under a node root (Input.Root) has its endpoints read under that root
// too. Mapped endpoints are named by Describe.
func (c *Config) KMSEndpointMapper(path string) func(endpoint string) (string, error) {
	if c == nil || c.mounts == nil || path == "" || path != c.EncryptionConfig || c.From["encryption-provider-config"] != c.fileSource {
		return nil
	}
	return c.hostKMSEndpoint
}

// hostKMSEndpoint maps one KMS endpoint, as kube-apiserver reads it
// (k8s.io/kms's ParseEndpoint: the path of a unix:// URL, "@name" for an
// abstract socket).
func (c *Config) hostKMSEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return endpoint, nil // kube-apiserver's validation refuses it, naming the field
	}
	sock, err := kmsutil.ParseEndpoint(endpoint)
	if err != nil || sock == "" {
		return endpoint, nil // not unix://: refused by the validation too
	}
	if strings.HasPrefix(sock, "@") {
		// An abstract socket is a name in the network namespace, not a file:
		// nothing to map (a static pod with hostNetwork shares the host's).
		return endpoint, nil
	}
	host, err := c.mounts.hostPath(sock)
	if err != nil {
		// Not under a hostPath mount, the socket is in the container's own
		// filesystem (e.g. an emptyDir shared with a plugin sidecar): dialling
		// the path as written would reach whatever is at that path on the
		// host, not kube-apiserver's plugin, and the failure would show up
		// only as values that do not decrypt. An operator expects the tool to
		// stop here, as it does for the manifest's own paths, saying how to
		// point it at the plugin.
		return "", &UnmappedKMSEndpointError{Endpoint: endpoint, Manifest: c.File, Dir: path.Dir(sock)}
	}
	if host == sock {
		return endpoint, nil
	}
	u.Path, u.RawPath = filepath.ToSlash(host), ""
	mapped := u.String()
	seen := false
	for _, m := range c.kmsMapped {
		seen = seen || m.container == endpoint
	}
	if !seen {
		c.kmsMapped = append(c.kmsMapped, mappedEndpoint{container: endpoint, host: mapped})
	}
	return mapped, nil
}

// UnmappedKMSEndpointError is a KMS plugin endpoint of the manifest's
// encryption configuration under none of its hostPath volumes: a
// configuration error, as a manifest path under none is (Load), found only
// once the encryption configuration is read.
type UnmappedKMSEndpointError struct {
	Endpoint string // as the configuration writes it
	Manifest string
	Dir      string // the socket's directory in the container
}

func (e *UnmappedKMSEndpointError) Error() string { return e.Render(input.Words) }

// Render is the message with the encryption configuration's input spelled by spell.
func (e *UnmappedKMSEndpointError) Render(spell func(input.Name) string) string {
	return fmt.Sprintf("endpoint %s: no hostPath volume of %s is mounted at or above %s in the container, so the tool cannot reach the KMS plugin where kube-apiserver does; give the tool %s with a copy of the file whose endpoint is the plugin's socket on this host", e.Endpoint, e.Manifest, e.Dir, spell(input.EncryptionProviderConfig))
}

// hostMounts maps container paths to host paths through hostPath volumes.
type hostMounts struct {
	mounts []mount // longest mount path first
}

type mount struct {
	container string
	host      string
}

// newHostMounts maps c's container paths to the host's through pod's
// hostPath volumes, the host's paths read under root ("" or "/": the
// machine's own).
func newHostMounts(pod *corev1.Pod, c *corev1.Container, root string) (*hostMounts, error) {
	hostPaths := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	m := &hostMounts{}
	for _, vm := range c.VolumeMounts {
		host, ok := hostPaths[vm.Name]
		if !ok {
			continue // not a hostPath volume: nothing on the host to read
		}
		if vm.SubPath != "" {
			host = filepath.Join(host, vm.SubPath)
		}
		host = underRoot(root, host)
		m.mounts = append(m.mounts, mount{container: path.Clean(vm.MountPath), host: host})
	}
	sort.SliceStable(m.mounts, func(i, j int) bool { return len(m.mounts[i].container) > len(m.mounts[j].container) })
	return m, nil
}

// rootMounts maps the host paths of a command line read from files, not
// from a pod (an installer's configuration), to where they are read: under
// root.
func rootMounts(root string) *hostMounts {
	return &hostMounts{mounts: []mount{{container: "/", host: underRoot(root, "/")}}}
}

// underRoot is the host path p as read under root ("" or "/": p itself).
func underRoot(root, p string) string {
	if root == "" || root == "/" || !filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}

func (m *hostMounts) hostPath(p string) (string, error) {
	if !path.IsAbs(p) {
		return "", fmt.Errorf("a relative path in a static pod is relative to the container's working directory; give an absolute path")
	}
	clean := path.Clean(p)
	for _, mt := range m.mounts {
		if clean == mt.container {
			return mt.host, nil
		}
		if rel, ok := strings.CutPrefix(clean, strings.TrimSuffix(mt.container, "/")+"/"); ok {
			return filepath.Join(mt.host, filepath.FromSlash(rel)), nil
		}
	}
	return "", fmt.Errorf("no hostPath volume is mounted at or above it in the container, so the file is not on the host")
}
