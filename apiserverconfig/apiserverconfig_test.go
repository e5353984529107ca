package apiserverconfig

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/version"
)

const kubeadmManifest = "../testdata/kubeadm/kube-apiserver.yaml"

func TestManifestKubeadm(t *testing.T) {
	cfg, err := Load(Input{Manifest: kubeadmManifest})
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string][2]string{
		"etcd servers":      {strings.Join(cfg.EtcdServers, ","), "https://127.0.0.1:2379"},
		"etcd CA":           {cfg.EtcdCAFile, "/etc/kubernetes/pki/etcd/ca.crt"},
		"etcd cert":         {cfg.EtcdCertFile, "/etc/kubernetes/pki/apiserver-etcd-client.crt"},
		"etcd key":          {cfg.EtcdKeyFile, "/etc/kubernetes/pki/apiserver-etcd-client.key"},
		"prefix":            {cfg.EtcdPrefix, "/cluster-a/registry"},
		"encryption config": {cfg.EncryptionConfig, "/etc/kubernetes/encryption/encryption-config.yaml"}, // mounted from another host directory
		"media type":        {cfg.StorageMediaType, "application/vnd.kubernetes.protobuf"},               // kube-apiserver's default
		"emulated version":  {cfg.EmulatedVersion, ""},
	}
	for what, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s: got %q, want %q", what, c[0], c[1])
		}
	}
	line := cfg.Describe(cfg.Release(), cfg.From["release"])
	for _, want := range []string{kubeadmManifest, "--etcd-prefix=/cluster-a/registry (manifest)", "--encryption-provider-config=/etc/kubernetes/encryption/encryption-config.yaml (manifest)"} {
		if !strings.Contains(line, want) {
			t.Errorf("Describe() = %q, want it to contain %q", line, want)
		}
	}
	if strings.Contains(line, "storage-media-type") {
		t.Errorf("Describe() = %q names a flag the manifest does not set", line)
	}
}

// writeManifest writes the kubeadm manifest with one command-line edit.
func writeManifest(t *testing.T, edit func(string) string) string {
	t.Helper()
	data, err := os.ReadFile(kubeadmManifest)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kube-apiserver.yaml")
	if err := os.WriteFile(p, []byte(edit(string(data))), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func addFlag(flag string) func(string) string {
	return func(s string) string {
		return strings.Replace(s, "    - --advertise-address=10.0.0.5\n", "    - --advertise-address=10.0.0.5\n    - "+flag+"\n", 1)
	}
}

func TestManifestRuntimeConfigAndGates(t *testing.T) {
	p := writeManifest(t, func(s string) string {
		s = addFlag("--runtime-config=resource.k8s.io/v1beta2=true")(s)
		s = addFlag("--feature-gates=DRAAdminAccess=false")(s)
		return addFlag("--emulated-version=1.35")(s)
	})
	// The tool's own flags come after the manifest's, key by key.
	cfg, err := Load(Input{Manifest: p, FeatureGates: []string{"DRAConsumableCapacity=false"}, RuntimeConfig: []string{"storagemigration.k8s.io/v1beta1=true"}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EmulatedVersion != "1.35" {
		t.Errorf("emulated version %q, want 1.35", cfg.EmulatedVersion)
	}
	if ev := cfg.Release().Effective().EmulationVersion(); ev.String() != "1.35" {
		t.Errorf("effective emulation version %s, want 1.35", ev)
	}
	for _, want := range []string{"DRAAdminAccess=false", "DRAConsumableCapacity=false"} {
		if !strings.Contains(cfg.FeatureGates, want) {
			t.Errorf("feature gates %q lack %q", cfg.FeatureGates, want)
		}
	}
	if cfg.From["feature-gates"] != FromTool || cfg.From["emulated-version"] != FromManifest {
		t.Errorf("sources %v", cfg.From)
	}
	if cfg.FeatureGate().Enabled("DRAAdminAccess") {
		t.Errorf("DRAAdminAccess enabled, the manifest disables it")
	}
	rc, err := cfg.ResourceConfig(cfg.Release().Effective())
	if err != nil {
		t.Fatal(err)
	}
	for gvr, want := range map[schema.GroupVersionResource]bool{
		{Group: "resource.k8s.io", Version: "v1beta2", Resource: "deviceclasses"}:                    true,
		{Group: "resource.k8s.io", Version: "v1beta1", Resource: "deviceclasses"}:                    false,
		{Group: "storagemigration.k8s.io", Version: "v1beta1", Resource: "storageversionmigrations"}: true,
		{Group: "apps", Version: "v1", Resource: "deployments"}:                                      true,
	} {
		if got := rc.ResourceEnabled(gvr); got != want {
			t.Errorf("%s enabled = %v, want %v", gvr, got, want)
		}
	}
}

func TestRejectsWhatKubeAPIServerRejects(t *testing.T) {
	cases := map[string]struct {
		in   func(t *testing.T) Input
		want string
	}{
		"unknown flag": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--no-such-flag=1"))}
		}, "no-such-flag"},
		"unknown feature gate in manifest": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--feature-gates=NoSuchGate=true"))}
		}, "NoSuchGate"},
		"unknown feature gate from the tool": {func(t *testing.T) Input {
			return Input{FeatureGates: []string{"NoSuchGate=true"}}
		}, "NoSuchGate"},
		"bad runtime-config": {func(t *testing.T) Input {
			return Input{RuntimeConfig: []string{"no.such.group/v9=true"}}
		}, "no.such.group/v9"},
		"target version out of range": {func(t *testing.T) Input {
			return Input{TargetVersion: version.MajorMinor(1, 20)}
		}, "1.20"},
		"emulated version in the manifest out of range": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--emulated-version=1.20"))}
		}, "1.20"},
		"bad media type": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--storage-media-type=text/plain"))}
		}, "storage-media-type"},
		"etcd-servers-overrides not kube-apiserver's format": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--etcd-servers-overrides=/events=https://127.0.0.1:2381"))}
		}, "--etcd-servers-overrides"},
		"etcd-servers-overrides of a resource not stored": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--etcd-servers-overrides=example.com/widgets#https://127.0.0.1:2381"))}
		}, "widgets.example.com"},
		"etcd-servers-overrides kube-apiserver does not apply": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--etcd-servers-overrides=events.k8s.io/events#https://127.0.0.1:2381"))}
		}, "kube-apiserver does not apply it"},
		"etcd-servers-overrides of a whole group": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, addFlag("--etcd-servers-overrides=coordination.k8s.io/*#https://127.0.0.1:2381"))}
		}, "a whole group"},
		"not a pod": {func(t *testing.T) Input {
			p := filepath.Join(t.TempDir(), "x.yaml")
			os.WriteFile(p, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"), 0o600)
			return Input{Manifest: p}
		}, "not a Pod manifest"},
		"not yaml": {func(t *testing.T) Input {
			p := filepath.Join(t.TempDir(), "x.yaml")
			os.WriteFile(p, []byte("\x00\x01garbage"), 0o600)
			return Input{Manifest: p}
		}, "x.yaml"},
		"missing file": {func(t *testing.T) Input {
			return Input{Manifest: "/nonexistent/kube-apiserver.yaml"}
		}, "/nonexistent/kube-apiserver.yaml"},
		"path outside every hostPath": {func(t *testing.T) Input {
			return Input{Manifest: writeManifest(t, func(s string) string {
				return strings.Replace(s, "/etc/kubernetes/enc/encryption-config.yaml", "/opt/enc.yaml", 1)
			})}
		}, "--encryption-provider-config /opt/enc.yaml"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load(c.in(t))
			if err == nil {
				t.Fatalf("accepted")
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line naming %q", err, c.want)
			}
		})
	}
}

func TestFlagsFile(t *testing.T) {
	dir := t.TempDir()
	unit := filepath.Join(dir, "kube-apiserver.service")
	os.WriteFile(unit, []byte(`[Unit]
Description=Kubernetes API Server

[Service]
ExecStart=/usr/local/bin/kube-apiserver \
  --etcd-servers=https://10.0.0.1:2379,https://10.0.0.2:2379 \
  --etcd-prefix=/k8s \
  --encryption-provider-config="/etc/kubernetes/encryption config.yaml" \
  --runtime-config=api/all=true \
  --v=2
Restart=on-failure
`), 0o600)
	cfg, err := Load(Input{FlagsFile: unit})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.EtcdServers, ","); got != "https://10.0.0.1:2379,https://10.0.0.2:2379" {
		t.Errorf("etcd servers %q", got)
	}
	if cfg.EtcdPrefix != "/k8s" || cfg.EncryptionConfig != "/etc/kubernetes/encryption config.yaml" {
		t.Errorf("prefix %q, encryption config %q", cfg.EtcdPrefix, cfg.EncryptionConfig)
	}
	if cfg.From["etcd-prefix"] != FromFlags {
		t.Errorf("etcd-prefix from %q", cfg.From["etcd-prefix"])
	}

	perLine := filepath.Join(dir, "flags")
	os.WriteFile(perLine, []byte("# one flag per line\n--etcd-servers=http://127.0.0.1:2379\n--storage-media-type=application/json\n"), 0o600)
	cfg, err = Load(Input{FlagsFile: perLine})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StorageMediaType != "application/json" {
		t.Errorf("media type %q", cfg.StorageMediaType)
	}

	envRef := filepath.Join(dir, "env")
	os.WriteFile(envRef, []byte("kube-apiserver $KUBE_API_ARGS\n"), 0o600)
	if _, err := Load(Input{FlagsFile: envRef}); err == nil || !strings.Contains(err.Error(), "environment variable") {
		t.Errorf("an unexpanded $VAR: %v", err)
	}
}

// TestLoggingGates: kube-apiserver's gate has the logging gates of
// component-base (its app registers them), so a command line setting them
// parses, as kube-apiserver accepts it.
func TestLoggingGates(t *testing.T) {
	cfg, err := Load(Input{FeatureGates: []string{"LoggingAlphaOptions=true,LoggingBetaOptions=false"}})
	if err != nil {
		t.Fatalf("logging gates refused: %v", err)
	}
	if !cfg.FeatureGate().Enabled("LoggingAlphaOptions") || cfg.FeatureGate().Enabled("LoggingBetaOptions") {
		t.Errorf("logging gates not set as given: %q", cfg.FeatureGates)
	}
}

// TestManifestKops: kops' manifest runs kube-apiserver through go-runner,
// whose own flags come first: the command line is kube-apiserver's from its
// program word on. Its etcd-manager's second etcd for Events
// (--etcd-servers-overrides) is the cluster's second etcd, holding the
// events; the same certificates reach both.
func TestManifestKops(t *testing.T) {
	const kops = "../testdata/kops/kube-apiserver.manifest"
	cfg, err := Load(Input{Manifest: kops})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.EtcdServers, ",") != "https://127.0.0.1:4001" || cfg.EtcdCAFile != "/srv/kubernetes/kube-apiserver/etcd-ca.crt" ||
		cfg.EncryptionConfig != "/srv/kubernetes/kube-apiserver/encryptionconfig.yaml" || cfg.Release().String() != "1.37" {
		t.Errorf("kops: servers %v, CA %s, encryption %s, release %s", cfg.EtcdServers, cfg.EtcdCAFile, cfg.EncryptionConfig, cfg.Release())
	}
	es, err := cfg.Etcds()
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || !es[0].Main() || strings.Join(es[0].Servers, ",") != "https://127.0.0.1:4001" ||
		es[1].Name != "events" || strings.Join(es[1].Servers, ",") != "https://127.0.0.1:4002" || strings.Join(es.MovedNames(), ",") != "events" {
		t.Errorf("kops: etcds %+v, want the main one on :4001 and events on :4002", es)
	}
	if d := cfg.Describe(cfg.Release(), ""); !strings.Contains(d, "--etcd-servers-overrides=/events#https://127.0.0.1:4002 (manifest)") {
		t.Errorf("the one-line report does not name the override: %s", d)
	}

	// Two resources on one etcd, one on another, one on the main etcd's
	// own servers (moving nothing): kube-apiserver's entries and servers
	// separators.
	data, err := os.ReadFile(kops)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kube-apiserver.manifest")
	overrides := "/events#https://127.0.0.1:4002;https://10.0.0.2:4002,coordination.k8s.io/leases#https://127.0.0.1:4003,/configmaps#https://127.0.0.1:4001,/pods#https://127.0.0.1:4002;https://10.0.0.2:4002"
	if err := os.WriteFile(p, []byte(strings.Replace(string(data), "--etcd-servers-overrides=/events#https://127.0.0.1:4002", "--etcd-servers-overrides="+overrides, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = Load(Input{Manifest: p})
	if err != nil {
		t.Fatal(err)
	}
	if es, err = cfg.Etcds(); err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, e := range es {
		got = append(got, e.Name+"@"+strings.Join(e.Servers, ";"))
	}
	if want := "@https://127.0.0.1:4001 events,pods@https://127.0.0.1:4002;https://10.0.0.2:4002 leases.coordination.k8s.io@https://127.0.0.1:4003"; strings.Join(got, " ") != want {
		t.Errorf("etcds %q, want %q", strings.Join(got, " "), want)
	}
}

// TestNodeRoot: with a node root, the host paths a manifest's hostPath
// volumes map to, and those of an installer's command line (k3s), are read
// under it, KMS plugin sockets included; the release of RKE2's hardened
// image is its Kubernetes release.
func TestNodeRoot(t *testing.T) {
	cfg, err := Load(Input{Manifest: kubeadmManifest, Root: "/node"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EtcdCAFile != "/node/etc/kubernetes/pki/etcd/ca.crt" || cfg.EncryptionConfig != "/node/etc/kubernetes/encryption/encryption-config.yaml" {
		t.Errorf("manifest under /node: CA %s, encryption %s", cfg.EtcdCAFile, cfg.EncryptionConfig)
	}
	cl := &CommandLine{Name: "k3s's configuration (/node/etc/rancher/k3s/config.yaml)", Source: "k3s", Args: []string{
		"--etcd-servers=https://127.0.0.1:2379", "--etcd-cafile=/var/lib/rancher/k3s/server/tls/etcd/server-ca.crt",
		"--encryption-provider-config=/var/lib/rancher/k3s/server/cred/encryption-config.json", "--storage-backend=etcd3"}}
	cfg, err = Load(Input{CommandLine: cl, Root: "/node"})
	if err != nil {
		t.Fatal(err)
	}
	enc := "/node/var/lib/rancher/k3s/server/cred/encryption-config.json"
	if cfg.EtcdCAFile != "/node/var/lib/rancher/k3s/server/tls/etcd/server-ca.crt" || cfg.EncryptionConfig != enc || cfg.From["etcd-servers"] != "k3s" {
		t.Errorf("k3s under /node: CA %s, encryption %s, from %q", cfg.EtcdCAFile, cfg.EncryptionConfig, cfg.From["etcd-servers"])
	}
	m := cfg.KMSEndpointMapper(enc)
	if m == nil {
		t.Fatal("no KMS endpoint mapping under the node root")
	}
	if got, err := m("unix:///var/run/kms/plugin.sock"); err != nil || got != "unix:///node/var/run/kms/plugin.sock" {
		t.Errorf("KMS endpoint under /node: %q %v", got, err)
	}
	if line := cfg.Describe(cfg.Release(), ""); !strings.HasPrefix(line, "kube-apiserver "+cl.Name+": --etcd-servers=https://127.0.0.1:2379 (k3s)") {
		t.Errorf("Describe() = %q", line)
	}
	// Without a root, an installer's command line is read as written.
	if cfg, err = Load(Input{CommandLine: cl}); err != nil || cfg.EtcdCAFile != "/var/lib/rancher/k3s/server/tls/etcd/server-ca.crt" || cfg.KMSEndpointMapper(cfg.EncryptionConfig) != nil {
		t.Errorf("k3s at /: %+v %v", cfg, err)
	}
	if v := ImageRelease("index.docker.io/rancher/hardened-kubernetes:v1.37.2-rke2r1-build20261120"); v == nil || v.String() != "1.37" {
		t.Errorf("RKE2's image release: %v", v)
	}
}

// TestEventTTL: --event-ttl as the command line sets it, else
// kube-apiserver's own default.
func TestEventTTL(t *testing.T) {
	dir := t.TempDir()
	for flags, want := range map[string]time.Duration{"--etcd-servers=http://127.0.0.1:2379\n": time.Hour, "--etcd-servers=http://127.0.0.1:2379\n--event-ttl=30m\n": 30 * time.Minute} {
		path := filepath.Join(dir, fmt.Sprintf("flags-%d", want))
		if err := os.WriteFile(path, []byte(flags), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := Load(Input{FlagsFile: path})
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.EventTTL(); got != want {
			t.Errorf("%q: event TTL %s, want %s", flags, got, want)
		}
	}
	if got := (*Config)(nil).EventTTL(); got != time.Hour {
		t.Errorf("no command line: %s, want kube-apiserver's default 1h", got)
	}
}
