package installer

import (
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"kube-etcd-migrate/apiserverconfig"
)

// k3sInstallUnit is the unit k3s's install script writes
// (k3s-io/k3s install.sh, create_systemd_service_file, as of commit
// 0136cf25): its three EnvironmentFile= lines, %N unexpanded, and
// ExecStart's "server" with the flags given to the script (none here).
const k3sInstallUnit = `[Unit]
Description=Lightweight Kubernetes
Documentation=https://k3s.io
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-/etc/systemd/system/k3s.service.env
KillMode=process
Delegate=yes
User=root
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/k3s \
    server \

`

// rke2ServerUnit is RKE2's rke2-server.service (rancher/rke2
// bundle/lib/systemd/system/rke2-server.service, as of v1.36.4-rc1+rke2r1):
// installed by the tarball in /usr/local/lib/systemd/system, by the RPM in
// /usr/lib/systemd/system with /usr/lib/... in its third EnvironmentFile=.
const rke2ServerUnit = `[Unit]
Description=Rancher Kubernetes Engine v2 (server)
Documentation=https://github.com/rancher/rke2#readme
Wants=network-online.target
After=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-/usr/local/lib/systemd/system/%N.env
KillMode=process
Delegate=yes
LimitNOFILE=1048576
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
TimeoutStartSec=0
Restart=always
RestartSec=5s
ExecCondition=/bin/sh -c 'if systemctl is-active --quiet rke2-agent.service; then echo "Error: rke2-agent is running!"; exit 1; fi'
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/local/bin/rke2 server
ExecStopPost=-/bin/sh -c "systemd-cgls /system.slice/%n | grep -Eo '[0-9]+ (containerd|kubelet)' | awk '{print $1}' | xargs -r kill"
`

// TestSettingsOutsideConfigYAML: a k3s or RKE2 server whose configuration
// file is named by K3S_CONFIG_FILE / RKE2_CONFIG_FILE in one of its unit's
// EnvironmentFile= files (%N expanded to the unit's name, as systemd does),
// or in a systemd drop-in (Environment=, or an ExecStart= replaced), is
// found with that file's settings; the files read are named.
func TestSettingsOutsideConfigYAML(t *testing.T) {
	// The operator's own configuration file, elsewhere than config.yaml,
	// with a data-dir of its own: only it says where the server is.
	const k3sOwn = "/etc/k3s/server.yaml"
	for _, tc := range []struct {
		name, file, content string
	}{
		{"/etc/default/%N", "/etc/default/k3s", "K3S_CONFIG_FILE=" + k3sOwn + "\n"},
		{"/etc/sysconfig/%N", "/etc/sysconfig/k3s", "K3S_CONFIG_FILE=\"" + k3sOwn + "\"\n"},
		{"the install script's k3s.service.env", "/etc/systemd/system/k3s.service.env", "K3S_TOKEN=not-printed\nK3S_CONFIG_FILE='" + k3sOwn + "'\n"},
		{"a drop-in's Environment=", "/etc/systemd/system/k3s.service.d/10-config.conf", "[Service]\nEnvironment=\"K3S_CONFIG_FILE=" + k3sOwn + "\"\n"},
		{"a drop-in's EnvironmentFile=", "/etc/systemd/system/k3s.service.d/10-env.conf", "[Service]\nEnvironmentFile=/etc/k3s/%n.vars\n"},
		{"a drop-in replacing ExecStart", "/etc/systemd/system/k3s.service.d/override.conf", "[Service]\nExecStart=\nExecStart=/usr/local/bin/k3s server --config " + k3sOwn + "\n"},
	} {
		t.Run("k3s "+tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "/etc/systemd/system/k3s.service", k3sInstallUnit)
			write(t, root, tc.file, tc.content)
			write(t, root, "/etc/k3s/k3s.service.vars", "K3S_CONFIG_FILE="+k3sOwn+"\n")
			write(t, root, k3sOwn, "cluster-init: true\ndata-dir: /srv/k3s\n")
			mkdir(t, root, "/srv/k3s/server/db/etcd")
			f, err := Find(root, "")
			if err != nil {
				t.Fatal(err)
			}
			if f.Installer != K3s || f.EtcdDataDir != filepath.Join(root, "/srv/k3s/server/db/etcd") || !slices.Contains(f.CommandLine, "--etcd-certfile=/srv/k3s/server/tls/etcd/client.crt") {
				t.Fatalf("%+v", f)
			}
			for _, want := range []string{filepath.Join(root, k3sOwn), filepath.Join(root, "/etc/systemd/system/k3s.service"), filepath.Join(root, tc.file)} {
				if !slices.Contains(f.Files, want) {
					t.Errorf("files %q lack %s", f.Files, want)
				}
			}
		})
	}
	// A variable the unit sets is overridden by its environment files
	// (systemd.exec(5)); a drop-in of /etc hides the same name's in /usr/lib.
	t.Run("k3s precedence", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/systemd/system/k3s.service", k3sInstallUnit+"Environment=K3S_CONFIG_FILE=/wrong.yaml\n")
		write(t, root, "/etc/default/k3s", "K3S_CONFIG_FILE="+k3sOwn+"\n")
		write(t, root, "/usr/lib/systemd/system/k3s.service.d/10-x.conf", "[Service]\nEnvironmentFile=/wrong.env\n")
		write(t, root, "/etc/systemd/system/k3s.service.d/10-x.conf", "[Service]\nEnvironment=K3S_DATASTORE_ENDPOINT=https://10.0.0.7:2379\n")
		write(t, root, "/wrong.env", "K3S_CONFIG_FILE=/wrong.yaml\n")
		write(t, root, k3sOwn, "data-dir: /srv/k3s\n")
		mkdir(t, root, "/srv/k3s/server")
		f, err := Find(root, "")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(f.CommandLine, "--etcd-servers=https://10.0.0.7:2379") || slices.Contains(f.Files, filepath.Join(root, "/wrong.env")) {
			t.Fatalf("%+v", f)
		}
	})

	const rke2Own = "/etc/rke2/server.yaml"
	for _, tc := range []struct {
		name, unit, unitText, file, content string
	}{
		{"tarball, /etc/default/%N", "/usr/local/lib/systemd/system/rke2-server.service", rke2ServerUnit, "/etc/default/rke2-server", "RKE2_CONFIG_FILE=" + rke2Own + "\n"},
		{"tarball, %N.env", "/usr/local/lib/systemd/system/rke2-server.service", rke2ServerUnit, "/usr/local/lib/systemd/system/rke2-server.env", "HOME=/root\nRKE2_CONFIG_FILE=" + rke2Own + "\n"},
		{"RPM, /etc/sysconfig/%N", "/usr/lib/systemd/system/rke2-server.service", strings.ReplaceAll(rke2ServerUnit, "/usr/local/", "/usr/"), "/etc/sysconfig/rke2-server", "RKE2_CONFIG_FILE=" + rke2Own + "\n"},
		{"a drop-in", "/usr/local/lib/systemd/system/rke2-server.service", rke2ServerUnit, "/etc/systemd/system/rke2-server.service.d/50-config.conf", "[Service]\nEnvironment=RKE2_CONFIG_FILE=" + rke2Own + "\n"},
	} {
		t.Run("rke2 "+tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.unit, tc.unitText)
			write(t, root, tc.file, tc.content)
			write(t, root, rke2Own, "data-dir: /data/rke2\n")
			write(t, root, "/data/rke2/agent/pod-manifests/kube-apiserver.yaml", testdata(t, "rke2/kube-apiserver.yaml"))
			mkdir(t, root, "/data/rke2/server/db/etcd")
			f, err := Find(root, "")
			if err != nil {
				t.Fatal(err)
			}
			if f.Installer != RKE2 || f.Manifest != filepath.Join(root, "/data/rke2/agent/pod-manifests/kube-apiserver.yaml") || f.EtcdDataDir != filepath.Join(root, "/data/rke2/server/db/etcd") {
				t.Fatalf("%+v", f)
			}
			for _, want := range []string{filepath.Join(root, rke2Own), filepath.Join(root, tc.unit), filepath.Join(root, tc.file)} {
				if !slices.Contains(f.Files, want) {
					t.Errorf("files %q lack %s", f.Files, want)
				}
			}
		})
	}
}

// TestRKE2OnKine: RKE2 runs kine, not etcd, for disable-etcd without
// server and for a datastore-endpoint that is not etcd's (rancher/rke2
// pkg/rke2/rke2_linux.go, initStaticPodExecutor), and then writes
// kube-apiserver's --etcd-servers as unixs://DATA/server/kine.sock
// (pkg/executor/staticpod/staticpod.go, APIServer). SQLite (DATA/server/
// db/state.db, or a sqlite:// datastore-endpoint) is found, with its file,
// PostgreSQL and MySQL with their datastore-endpoint, credentials never
// shown; NATS is refused with the reason. disable-etcd with server (a control-plane-only server) and an etcd
// datastore-endpoint are not kine.
func TestRKE2OnKine(t *testing.T) {
	kineManifest := strings.Replace(testdata(t, "rke2/kube-apiserver.yaml"), "--etcd-servers=https://127.0.0.1:2379", "--etcd-servers=unixs:///var/lib/rancher/rke2/server/kine.sock", 1)
	for _, tc := range []struct {
		name, config, db string
	}{
		{"disable-etcd, no server", "disable-etcd: true\n", "/var/lib/rancher/rke2/server/db/state.db"},
		{"a SQLite datastore-endpoint", "datastore-endpoint: sqlite:///data/rke2.db\n", "/data/rke2.db"},
		// The configuration is elsewhere (a --config the tool does not see):
		// the manifest RKE2 wrote says it.
		{"the manifest's kine socket", "", "/var/lib/rancher/rke2/server/db/state.db"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.config != "" {
				write(t, root, "/etc/rancher/rke2/config.yaml", tc.config)
			}
			write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", kineManifest)
			mkdir(t, root, "/var/lib/rancher/rke2/server/db")
			f, err := Find(root, "")
			if err != nil || f.Installer != RKE2 || f.KineDatabase != filepath.Join(root, tc.db) || !strings.Contains(f.What(), "SQLite through kine") {
				t.Fatalf("%+v %v\nwant the SQLite datastore %s", f, err, tc.db)
			}
		})
	}
	for _, tc := range []struct {
		name, config, want string
	}{
		{"NATS", "datastore-endpoint: nats://rke2:s3cr3t@nats.example.com:4222\n", "its datastore-endpoint is NATS through kine, not etcd: the tool works on etcd, and on SQLite, PostgreSQL and MySQL through kine"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "/etc/rancher/rke2/config.yaml", tc.config)
			write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", kineManifest)
			_, err := Find(root, "")
			var ue *UnsupportedError
			if !errors.As(err, &ue) || ue.Installer != RKE2 || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cr3t") || !strings.HasPrefix(err.Error(), "found rke2 on this node (") {
				t.Fatalf("%v\nwant %q", err, tc.want)
			}
		})
	}
	t.Run("PostgreSQL", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/rancher/rke2/config.yaml", "datastore-endpoint: postgres://rke2:s3cr3t@db.example.com:5432/rke2\n")
		write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", kineManifest)
		f, err := Find(root, "")
		if err != nil || f.Installer != RKE2 || !f.OnKine() || f.KineDatabase != "" || !strings.Contains(f.What(), "PostgreSQL through kine, the database rke2 on db.example.com:5432") || strings.Contains(f.What(), "s3cr3t") {
			t.Fatalf("%v %v", f.What(), err)
		}
	})
	t.Run("MySQL", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/rancher/rke2/config.yaml", "datastore-endpoint: mysql://rke2:s3cr3t@tcp(db.example.com:3306)/rke2\n")
		write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", kineManifest)
		f, err := Find(root, "")
		if err != nil || f.Installer != RKE2 || !f.OnKine() || f.KineKind() != "MySQL" || f.KineDatabase != "" || !strings.Contains(f.What(), "MySQL through kine, the database rke2 on db.example.com") || strings.Contains(f.What(), "s3cr3t") || !strings.Contains(strings.Join(f.Notes, "\n"), "RKE2 keeps this cluster in MySQL") {
			t.Fatalf("%v %v %q", f.What(), err, f.Notes)
		}
	})
	for _, tc := range []struct{ name, config string }{
		{"disable-etcd with server", "disable-etcd: true\nserver: https://10.0.0.5:9345\n"},
		{"etcd over a unix socket", "datastore-endpoint: unixs:///run/etcd/client.sock\n"},
		{"etcd over https", "datastore-endpoint: https://10.0.0.7:2379\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "/etc/rancher/rke2/config.yaml", tc.config)
			write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", testdata(t, "rke2/kube-apiserver.yaml"))
			if f, err := Find(root, ""); err != nil || f.Installer != RKE2 {
				t.Fatalf("%+v %v", f, err)
			}
		})
	}
}

// TestK3sUnixSocketEtcd: a datastore-endpoint of unix:// or unixs:// is an
// etcd (k3s-io/kine v0.16.4 pkg/drivers/remote/remote.go: kine builds no
// database for it and k3s hands it to kube-apiserver as it is), not kine.
func TestK3sUnixSocketEtcd(t *testing.T) {
	for _, tc := range []struct{ config, want string }{
		{"datastore-endpoint: unix:///run/etcd/etcd.sock\n", "--etcd-servers=unix:///run/etcd/etcd.sock"},
		{"datastore-endpoint: unixs:///run/etcd/etcd.sock\ndatastore-cafile: /etc/etcd/ca.pem\ndatastore-certfile: /etc/etcd/client.pem\ndatastore-keyfile: /etc/etcd/client-key.pem\n", "--etcd-servers=unixs:///run/etcd/etcd.sock"},
	} {
		root := t.TempDir()
		write(t, root, "/etc/rancher/k3s/config.yaml", tc.config)
		mkdir(t, root, "/var/lib/rancher/k3s/server")
		f, err := Find(root, "")
		if err != nil {
			t.Fatalf("%q: %v", tc.config, err)
		}
		if !slices.Contains(f.CommandLine, tc.want) || f.Datastore != "an external etcd, its datastore-endpoint" {
			t.Errorf("%q: %+v", tc.config, f)
		}
	}
	// Not a URL kine knows is not etcd either.
	root := t.TempDir()
	write(t, root, "/etc/rancher/k3s/config.yaml", "datastore-endpoint: /run/etcd/etcd.sock\n")
	mkdir(t, root, "/var/lib/rancher/k3s/server")
	var ue *UnsupportedError
	if _, err := Find(root, ""); !errors.As(err, &ue) {
		t.Errorf("no scheme: %v", err)
	}
}

// TestK3sIPv6Loopback: k3s's etcd listens on, and its kube-apiserver
// reaches it at, the loopback of the family of the cluster's first service
// CIDR (k3s-io/k3s pkg/etcd/etcd.go getEndpoints and listenClientURLs,
// pkg/daemons/config/types.go Control.Loopback, pkg/cli/server/server.go:
// ServiceIPRange is service-cidr's first entry; without one, k3s's default
// is fd00:43::/112 for an IPv6 node IP).
func TestK3sIPv6Loopback(t *testing.T) {
	for _, tc := range []struct {
		name, config, unitFlags, want string
	}{
		{"IPv6-only", "cluster-init: true\ncluster-cidr: fd00:42::/56\nservice-cidr: fd00:43::/112\n", "", "https://[::1]:2379"},
		{"dual-stack, IPv6 first", "cluster-init: true\ncluster-cidr: [\"fd00:42::/56\", \"10.42.0.0/16\"]\nservice-cidr: [\"fd00:43::/112\", \"10.43.0.0/16\"]\n", "", "https://[::1]:2379"},
		{"dual-stack, IPv4 first", "cluster-init: true\nservice-cidr: 10.43.0.0/16,fd00:43::/112\n", "", "https://127.0.0.1:2379"},
		{"IPv6 node-ip, default service-cidr", "cluster-init: true\nnode-ip: 2001:db8::5\n", "", "https://[::1]:2379"},
		{"the unit's --service-cidr", "cluster-init: true\n", " '--service-cidr' 'fd00:43::/112'", "https://[::1]:2379"},
		{"IPv4 (the default)", "cluster-init: true\n", "", "https://127.0.0.1:2379"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "/etc/rancher/k3s/config.yaml", tc.config)
			write(t, root, "/etc/systemd/system/k3s.service", strings.Replace(k3sInstallUnit, "    server \\\n", "    server"+tc.unitFlags+" \\\n", 1))
			mkdir(t, root, "/var/lib/rancher/k3s/server/db/etcd")
			f, err := Find(root, "")
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(f.CommandLine, "--etcd-servers="+tc.want) {
				t.Fatalf("command line %q, want --etcd-servers=%s", f.CommandLine, tc.want)
			}
			if strings.Contains(tc.want, "::1") && !slices.ContainsFunc(f.Notes, func(n string) bool { return strings.Contains(n, "reached at [::1]") }) {
				t.Errorf("notes %q", f.Notes)
			}
			// kube-apiserver's own option code takes the address.
			cfg, err := apiserverconfig.Load(apiserverconfig.Input{CommandLine: &apiserverconfig.CommandLine{Name: "k3s", Args: f.CommandLine, Source: apiserverconfig.FromFlags}, Root: root})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.EtcdServers, []string{tc.want}) {
				t.Errorf("etcd servers %q", cfg.EtcdServers)
			}
		})
	}
}

// TestKopsThreeEtcds: a kops control-plane node with etcd-manager's main,
// events and leases clusters (kubernetes/kops v1.37.0-alpha.1-280
// pkg/model/components/apiserver.go: --etcd-servers-overrides
// /events#https://127.0.0.1:4002 and coordination.k8s.io/leases#https://127.0.0.1:4004,
// pkg/wellknownports; nodeup/pkg/model/manifests.go: one
// /etc/kubernetes/manifests/etcd-NAME-IG.manifest each) is found with
// etcd-main's manifest, the three etcds read from kube-apiserver's flags,
// and etcd-manager's volumes named where they are mounted: /mnt/master-ID
// (AWS), /mnt/disks/master-ZONE-NAME on ContainerOS (kopeio/etcd-manager
// pkg/volumes/mounter.go, pkg/volumes/gce/volumes.go), and the pre-mounted
// /mnt/disks/CLUSTER--ETCD--N/mnt of bare metal (pkg/volumes/external,
// kops tests/e2e/scenarios/bare-metal/run-test).
func TestKopsThreeEtcds(t *testing.T) {
	manifest := strings.Replace(testdata(t, "kops/kube-apiserver.manifest"), "--etcd-servers-overrides=/events#https://127.0.0.1:4002",
		"--etcd-servers-overrides=/events#https://127.0.0.1:4002,coordination.k8s.io/leases#https://127.0.0.1:4004", 1)
	for _, tc := range []struct {
		name string
		vols []string
	}{
		{"AWS", []string{"/mnt/master-vol-0a1b2c3d4e5f60718", "/mnt/master-vol-0a1b2c3d4e5f60719", "/mnt/master-vol-0a1b2c3d4e5f60720"}},
		{"ContainerOS", []string{"/mnt/disks/master-us-central1-a-a-etcd-events-example-k8s-local", "/mnt/disks/master-us-central1-a-a-etcd-leases-example-k8s-local", "/mnt/disks/master-us-central1-a-a-etcd-main-example-k8s-local"}},
		{"bare metal", []string{"/mnt/disks/metal.k8s.local--events--0/mnt", "/mnt/disks/metal.k8s.local--leases--0/mnt", "/mnt/disks/metal.k8s.local--main--0/mnt"}},
		{"none mounted", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, "/etc/kubernetes/manifests/kube-apiserver.manifest", manifest)
			for _, n := range []string{"events", "leases", "main"} {
				write(t, root, "/etc/kubernetes/manifests/etcd-"+n+"-control-plane-us-central1-a.manifest", "apiVersion: v1\nkind: Pod\n")
			}
			for _, v := range tc.vols {
				mkdir(t, root, v)
			}
			f, err := Find(root, "")
			if err != nil {
				t.Fatal(err)
			}
			if f.Installer != Kops || f.EtcdManifest != filepath.Join(root, "/etc/kubernetes/manifests/etcd-main-control-plane-us-central1-a.manifest") || f.EtcdDataDir != "" {
				t.Fatalf("%+v", f)
			}
			var note string
			for _, n := range f.Notes {
				if strings.Contains(n, "etcd-manager keeps etcd's data on volumes") {
					note = n
				}
			}
			var want []string
			for _, v := range tc.vols {
				want = append(want, filepath.Join(root, v))
			}
			if len(want) > 0 && !strings.Contains(note, "mounted on this node: "+strings.Join(want, ", ")+" (") {
				t.Errorf("note %q, want %q", note, want)
			}
			if len(want) == 0 && !strings.Contains(note, "(/mnt/master-*, /mnt/disks/master-*, /mnt/disks/*--*--*/mnt); none found on this node") {
				t.Errorf("note %q", note)
			}
			cfg, err := apiserverconfig.Load(apiserverconfig.Input{Manifest: f.Manifest, Root: root})
			if err != nil {
				t.Fatal(err)
			}
			es, err := cfg.Etcds()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range es {
				got = append(got, e.Name+"@"+strings.Join(e.Servers, ";"))
			}
			if w := "@https://127.0.0.1:4001 events@https://127.0.0.1:4002 leases.coordination.k8s.io@https://127.0.0.1:4004"; strings.Join(got, " ") != w {
				t.Errorf("etcds %q, want %q", got, w)
			}
		})
	}
}
