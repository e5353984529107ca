package installer

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// write writes content at the node's path p under root.
func write(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, root, p string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(root, p), 0o700); err != nil {
		t.Fatal(err)
	}
}

func testdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFindEachInstaller: each installer's control-plane node, laid out as
// its documentation and code lay it out, is found and named, with its
// kube-apiserver configuration and etcd's data directory; an empty node is
// an error listing every place looked at.
func TestFindEachInstaller(t *testing.T) {
	t.Run("kubeadm", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/kubernetes/manifests/kube-apiserver.yaml", testdata(t, "kubeadm/kube-apiserver.yaml"))
		write(t, root, "/etc/kubernetes/manifests/etcd.yaml", testdata(t, "kubeadm/etcd.yaml"))
		f, err := Find(root, "")
		if err != nil {
			t.Fatal(err)
		}
		if f.Installer != Kubeadm || f.Manifest != filepath.Join(root, "/etc/kubernetes/manifests/kube-apiserver.yaml") || f.Parked ||
			f.EtcdDataDir != filepath.Join(root, "/var/lib/etcd") || f.EtcdManifest != filepath.Join(root, "/etc/kubernetes/manifests/etcd.yaml") {
			t.Fatalf("kubeadm: %+v", f)
		}
		if w := f.What(); !strings.Contains(w, "found kubeadm on this node (under "+root+"): kube-apiserver's manifest "+f.Manifest) || !strings.Contains(w, "etcd's data directory "+f.EtcdDataDir+" (etcd's manifest)") {
			t.Errorf("What() = %q", w)
		}
	})
	t.Run("kubeadm parked", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/kubernetes/kube-apiserver.yaml", testdata(t, "kubeadm/kube-apiserver.yaml"))
		write(t, root, "/etc/kubernetes/manifests/etcd.yaml", testdata(t, "kubeadm/etcd.yaml"))
		f, err := Find(root, "")
		if err != nil {
			t.Fatal(err)
		}
		if !f.Parked || f.Manifest != filepath.Join(root, "/etc/kubernetes/kube-apiserver.yaml") || !strings.Contains(f.What(), "(parked out of "+filepath.Join(root, "/etc/kubernetes/manifests")+": kube-apiserver stopped)") {
			t.Fatalf("parked: %+v\n%s", f, f.What())
		}
		// The same file in both places: the kubelet's, with a note.
		write(t, root, "/etc/kubernetes/manifests/kube-apiserver.yaml", testdata(t, "kubeadm/kube-apiserver.yaml"))
		if f, err = Find(root, ""); err != nil || f.Parked || len(f.Notes) != 1 || !strings.Contains(f.Notes[0], "is also there") {
			t.Fatalf("both, the same: %+v %v", f, err)
		}
		// Two different ones: which does kube-apiserver run with? Refused.
		write(t, root, "/etc/kubernetes/kube-apiserver.yaml", testdata(t, "kubeadm/kube-apiserver.yaml")+"# edited\n")
		var ce *ManifestConflictError
		if _, err = Find(root, ""); !errors.As(err, &ce) || !strings.Contains(err.Error(), "two different kube-apiserver manifests") {
			t.Fatalf("both, different: %v", err)
		}
	})
	t.Run("kops", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/kubernetes/manifests/kube-apiserver.manifest", testdata(t, "kops/kube-apiserver.manifest"))
		write(t, root, "/etc/kubernetes/manifests/etcd-main-master-us-east-1a.manifest", "apiVersion: v1\nkind: Pod\n")
		f, err := Find(root, "")
		if err != nil {
			t.Fatal(err)
		}
		if f.Installer != Kops || f.Manifest != filepath.Join(root, "/etc/kubernetes/manifests/kube-apiserver.manifest") || f.EtcdDataDir != "" ||
			f.EtcdManifest != filepath.Join(root, "/etc/kubernetes/manifests/etcd-main-master-us-east-1a.manifest") {
			t.Fatalf("kops: %+v", f)
		}
		if !strings.Contains(f.What(), "etcd's data directory not known on this node") {
			t.Errorf("What() = %q", f.What())
		}
	})
	t.Run("rke2", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/rancher/rke2/config.yaml", "token: not-printed\ntls-san: [rke2.example.com]\n")
		write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml", testdata(t, "rke2/kube-apiserver.yaml"))
		write(t, root, "/var/lib/rancher/rke2/agent/pod-manifests/etcd.yaml", testdata(t, "rke2/etcd.yaml"))
		write(t, root, "/var/lib/rancher/rke2/server/db/etcd/config", testdata(t, "rke2/etcd-config"))
		f, err := Find(root, "")
		if err != nil {
			t.Fatal(err)
		}
		if f.Installer != RKE2 || f.Manifest != filepath.Join(root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml") ||
			f.EtcdDataDir != filepath.Join(root, "/var/lib/rancher/rke2/server/db/etcd") || !strings.HasPrefix(f.EtcdDataDirFrom, "etcd's configuration ") {
			t.Fatalf("rke2: %+v", f)
		}
		// A data-dir of its own, and the manifest parked.
		root = t.TempDir()
		write(t, root, "/etc/rancher/rke2/config.yaml.d/10-data.yaml", "data-dir: /data/rke2\n")
		write(t, root, "/data/rke2/agent/kube-apiserver.yaml", testdata(t, "rke2/kube-apiserver.yaml"))
		mkdir(t, root, "/data/rke2/server/db/etcd")
		if f, err = Find(root, ""); err != nil || !f.Parked || f.EtcdDataDir != filepath.Join(root, "/data/rke2/server/db/etcd") {
			t.Fatalf("rke2 with data-dir: %+v %v", f, err)
		}
	})
	t.Run("k3s", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/rancher/k3s/config.yaml", "cluster-init: true\nsecrets-encryption: true\ntoken: not-printed\n")
		mkdir(t, root, "/var/lib/rancher/k3s/server/db/etcd")
		f, err := Find(root, "")
		if err != nil {
			t.Fatal(err)
		}
		want := []string{
			"--encryption-provider-config=/var/lib/rancher/k3s/server/cred/encryption-config.json",
			"--encryption-provider-config-automatic-reload=true",
			"--etcd-cafile=/var/lib/rancher/k3s/server/tls/etcd/server-ca.crt",
			"--etcd-certfile=/var/lib/rancher/k3s/server/tls/etcd/client.crt",
			"--etcd-keyfile=/var/lib/rancher/k3s/server/tls/etcd/client.key",
			"--etcd-servers=https://127.0.0.1:2379",
			"--storage-backend=etcd3",
		}
		if f.Installer != K3s || !reflect.DeepEqual(f.CommandLine, want) || f.EtcdDataDir != filepath.Join(root, "/var/lib/rancher/k3s/server/db/etcd") || f.Datastore != "embedded etcd" {
			t.Fatalf("k3s: %+v\nwant command line %q", f, want)
		}
		if w := f.What(); !strings.Contains(w, "kube-apiserver's command line as k3s builds it from "+filepath.Join(root, "/etc/rancher/k3s/config.yaml")+" (embedded etcd)") || strings.Contains(w, "not-printed") {
			t.Errorf("What() = %q", w)
		}
	})
	t.Run("none", func(t *testing.T) {
		root := t.TempDir()
		mkdir(t, root, "/var/lib/rancher/k3s/agent") // a k3s agent: no control plane
		_, err := Find(root, "")
		var nf *NotFoundError
		if !errors.As(err, &nf) {
			t.Fatalf("empty node: %v", err)
		}
		for _, want := range []string{"no control plane found on this node: looked for kubeadm (" + filepath.Join(root, "/etc/kubernetes/manifests/kube-apiserver.yaml"),
			"kops (" + filepath.Join(root, "/etc/kubernetes/manifests/kube-apiserver.manifest"), "rke2 (" + filepath.Join(root, "/var/lib/rancher/rke2/agent/pod-manifests/kube-apiserver.yaml"),
			"k3s (" + filepath.Join(root, "/etc/rancher/k3s/config.yaml"), filepath.Join(root, "/var/lib/rancher/k3s/server") + ")",
			"name the cluster with kube-apiserver manifest, kube-apiserver flags file or etcd endpoints"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%v\nlacks %q", err, want)
			}
		}
		if _, err := Find(root, K3s); err == nil || !strings.HasPrefix(err.Error(), "no k3s control plane found on this node: looked for k3s (") || strings.Contains(err.Error(), "kubeadm (") {
			t.Errorf("only k3s: %v", err)
		}
	})
	t.Run("two", func(t *testing.T) {
		root := t.TempDir()
		write(t, root, "/etc/kubernetes/manifests/kube-apiserver.yaml", testdata(t, "kubeadm/kube-apiserver.yaml"))
		write(t, root, "/etc/rancher/k3s/config.yaml", "cluster-init: true\n")
		mkdir(t, root, "/var/lib/rancher/k3s/server")
		var ae *AmbiguousError
		if _, err := Find(root, ""); !errors.As(err, &ae) || !strings.Contains(err.Error(), "more than one control plane found on this node: kubeadm (") || !strings.Contains(err.Error(), "; k3s (") || !strings.Contains(err.Error(), "installer kubeadm|k3s") {
			t.Fatalf("two: %v", err)
		}
		if f, err := Find(root, K3s); err != nil || f.Installer != K3s {
			t.Fatalf("--distribution k3s: %+v %v", f, err)
		}
	})
}

// TestK3sConfigurationMerged: k3s's configuration is merged as k3s merges
// it (config.yaml, then config.yaml.d in name order, "key+" appending; the
// systemd unit's ExecStart flags after the files, its environment last),
// and kube-apiserver-arg combined with k3s's defaults as k3s combines them.
func TestK3sConfigurationMerged(t *testing.T) {
	root := t.TempDir()
	write(t, root, "/etc/rancher/k3s/config.yaml", "secrets-encryption: true\nkube-apiserver-arg:\n- etcd-prefix=/k3s\n- feature-gates=A=true\n")
	write(t, root, "/etc/rancher/k3s/config.yaml.d/20-b.yml", "kube-apiserver-arg+:\n- etcd-servers+=https://10.0.0.9:2379\n")
	write(t, root, "/etc/rancher/k3s/config.yaml.d/10-a.yaml", "kube-apiserver-arg+: [runtime-config=api/beta=true]\ndata-dir: /wrong\n")
	write(t, root, "/etc/rancher/k3s/config.yaml.d/30-ignored.txt", "data-dir: /ignored\n")
	write(t, root, "/etc/systemd/system/k3s.service", "[Unit]\nDescription=Lightweight Kubernetes\n[Service]\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\nExecStart=/usr/local/bin/k3s \\\n    server \\\n\t'--cluster-init' \\\n\t'--data-dir' '/srv/k3s' \\\n\t'--kube-apiserver-arg=feature-gates=B=true' \\\n\n")
	write(t, root, "/etc/systemd/system/k3s.service.env", "K3S_TOKEN=\"not-printed\"\nK3S_DATASTORE_CAFILE=/ignored-without-an-endpoint\n")
	mkdir(t, root, "/srv/k3s/server")
	f, err := Find(root, "")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"--encryption-provider-config=/srv/k3s/server/cred/encryption-config.json",
		"--encryption-provider-config-automatic-reload=true",
		"--etcd-cafile=/srv/k3s/server/tls/etcd/server-ca.crt",
		"--etcd-certfile=/srv/k3s/server/tls/etcd/client.crt",
		"--etcd-keyfile=/srv/k3s/server/tls/etcd/client.key",
		"--etcd-prefix=/k3s",
		"--etcd-servers=https://127.0.0.1:2379",
		"--etcd-servers=https://10.0.0.9:2379",
		"--feature-gates=A=true",
		"--feature-gates=B=true",
		"--runtime-config=api/beta=true",
		"--storage-backend=etcd3",
	}
	if !reflect.DeepEqual(f.CommandLine, want) {
		t.Errorf("command line:\n%q\nwant\n%q", f.CommandLine, want)
	}
	wantFiles := []string{filepath.Join(root, "/etc/rancher/k3s/config.yaml"), filepath.Join(root, "/etc/rancher/k3s/config.yaml.d/10-a.yaml"),
		filepath.Join(root, "/etc/rancher/k3s/config.yaml.d/20-b.yml"), filepath.Join(root, "/etc/systemd/system/k3s.service"), filepath.Join(root, "/etc/systemd/system/k3s.service.env")}
	if !reflect.DeepEqual(f.Files, wantFiles) || f.EtcdDataDir != filepath.Join(root, "/srv/k3s/server/db/etcd") {
		t.Errorf("files %q, etcd data %s", f.Files, f.EtcdDataDir)
	}

	for _, tc := range []struct {
		extra []string
		want  []string
	}{
		{[]string{"etcd-servers=https://a:2379"}, []string{"--etcd-servers=https://a:2379"}},
		{[]string{"etcd-servers-=https://a:2379"}, []string{"--etcd-servers=https://a:2379", "--etcd-servers=https://127.0.0.1:2379"}},
		{[]string{"--etcd-servers=https://a:2379", "etcd-servers=https://b:2379"}, []string{"--etcd-servers=https://a:2379", "--etcd-servers=https://b:2379"}},
		{[]string{"etcd-servers+=https://a:2379", "etcd-servers+=https://b:2379"}, []string{"--etcd-servers=https://127.0.0.1:2379", "--etcd-servers=https://a:2379", "--etcd-servers=https://b:2379"}},
		{[]string{"profiling"}, []string{"--etcd-servers=https://127.0.0.1:2379", "--profiling=true"}},
	} {
		if got := k3sArgs(map[string]string{"etcd-servers": "https://127.0.0.1:2379"}, tc.extra); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("k3sArgs(%q) = %q, want %q", tc.extra, got, tc.want)
		}
	}
}

// TestK3sNotEtcdRefused: a k3s server whose datastore is kine on NATS (or
// on MySQL under a scheme kine does not take), or that runs no etcd of its
// own, is refused with the reason, its
// credentials never in the message; kine on SQLite is found with its
// database file, kine on PostgreSQL or MySQL with its datastore-endpoint
// (named without its password); an external etcd is taken as
// kube-apiserver takes it.
func TestK3sNotEtcdRefused(t *testing.T) {
	for _, tc := range []struct {
		config string
		etcd   bool
		want   string
	}{
		{"datastore-endpoint: nats://k3s:s3cr3t@nats.example.com:4222\n", true, "its datastore-endpoint is NATS through kine, not etcd"},
		{"datastore-endpoint: MYSQL://k3s:s3cr3t@tcp(db.example.com:3306)/k3s\n", true, "its datastore-endpoint begins MYSQL://, which kine does not take (its MySQL scheme is mysql://, lowercase)"},
		{"datastore-endpoint: POSTGRES://k3s:s3cr3t@db.example.com:5432/k3s\n", true, "its datastore-endpoint begins POSTGRES://, which kine does not take (its PostgreSQL scheme is postgres://, lowercase)"},
		{"datastore-endpoint: PostgreSQL://k3s:s3cr3t@db.example.com/k3s\n", true, "its datastore-endpoint begins PostgreSQL://, which kine does not take (its PostgreSQL scheme is postgresql://, lowercase)"},
		{"datastore-endpoint: SQLite:///var/lib/rancher/k3s/server/db/state.db\n", true, "its datastore-endpoint begins SQLite://, which kine does not take (its SQLite scheme is sqlite://, lowercase)"},
		{"disable-etcd: true\nserver: https://etcd-1.example.com:6443\n", false, "this server runs no etcd (disable-etcd"},
	} {
		root := t.TempDir()
		write(t, root, "/etc/rancher/k3s/config.yaml", tc.config)
		mkdir(t, root, "/var/lib/rancher/k3s/server/db")
		if tc.etcd {
			mkdir(t, root, "/var/lib/rancher/k3s/server/db/etcd")
		}
		_, err := Find(root, "")
		var ue *UnsupportedError
		if !errors.As(err, &ue) || !strings.HasPrefix(err.Error(), "found k3s on this node ("+filepath.Join(root, "/etc/rancher/k3s/config.yaml")+"), but ") || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: %v\nwant %q", tc.config, err, tc.want)
		}
	}
	for _, tc := range []struct{ config, db string }{
		// k3s's default (pkg/cluster/cluster.go, v1.37: no etcd directory,
		// no cluster-init: kine on DATA/server/db/state.db).
		{"write-kubeconfig-mode: \"0644\"\n", "/var/lib/rancher/k3s/server/db/state.db"},
		{"data-dir: /srv/k3s\n", "/srv/k3s/server/db/state.db"},
		// kine's SQLite DSN as a datastore-endpoint.
		{"datastore-endpoint: sqlite:///data/k3s.db?_journal=WAL&cache=shared\n", "/data/k3s.db"},
	} {
		root := t.TempDir()
		write(t, root, "/etc/rancher/k3s/config.yaml", tc.config)
		mkdir(t, root, "/var/lib/rancher/k3s/server/db")
		mkdir(t, root, "/srv/k3s/server/db")
		f, err := Find(root, "")
		if err != nil || f.KineDatabase != filepath.Join(root, tc.db) || f.EtcdDataDir != "" || !strings.Contains(f.What(), "SQLite through kine, "+filepath.Join(root, tc.db)) {
			t.Errorf("%q: %+v %v\nwant the SQLite datastore %s", tc.config, f, err, tc.db)
		}
	}
	// kine's PostgreSQL (k3s pkg/cli/cmds/server.go: datastore-endpoint,
	// -cafile, -certfile, -keyfile, handed to kine by pkg/daemons/control).
	for _, tc := range []struct{ config, what string }{
		{"datastore-endpoint: postgres://k3s:s3cr3t@db.example.com:5432/K3s?sslmode=verify-full\ndatastore-cafile: /etc/k3s/pg-ca.pem\n", "PostgreSQL through kine, the database k3s on db.example.com:5432 (its datastore-endpoint)"},
		{"datastore-endpoint: postgresql://k3s:s3cr3t@db.example.com\n", "PostgreSQL through kine, the database kubernetes on db.example.com (its datastore-endpoint)"},
		// kine's MySQL (kine's DSN: go-sql-driver's, behind mysql://).
		{"datastore-endpoint: mysql://k3s:s3cr3t@tcp(db.example.com:3306)/k3s\n", "MySQL through kine, the database k3s on db.example.com (its datastore-endpoint)"},
		{"datastore-endpoint: \"mysql://k3s:s3cr3t@tcp(10.0.0.9:3307)/\"\n", "MySQL through kine, the database kubernetes on 10.0.0.9:3307 (its datastore-endpoint)"},
		{"datastore-endpoint: mysql://k3s:s3cr3t@unix(/run/mysqld/mysqld.sock)/k3s\n", "MySQL through kine, the database k3s on /run/mysqld/mysqld.sock (its datastore-endpoint)"},
		// Found, and named without a piece of it: serving it says what is wrong.
		{"datastore-endpoint: mysql://k3s:s3cr3t@tcp(db.example.com/k3s\n", "MySQL through kine, the database of a DSN that does not parse (its datastore-endpoint)"},
	} {
		root := t.TempDir()
		write(t, root, "/etc/rancher/k3s/config.yaml", tc.config)
		mkdir(t, root, "/var/lib/rancher/k3s/server/db")
		f, err := Find(root, "")
		if err != nil || !f.OnKine() || f.KineDatabase != "" || f.EtcdDataDir != "" || !strings.Contains(f.What(), tc.what) || strings.Contains(f.What(), "s3cr3t") || !strings.Contains(f.KineDSN, "s3cr3t") {
			t.Errorf("%q: %v %v\nwant %q", tc.config, f.What(), err, tc.what)
			continue
		}
		if strings.Contains(tc.config, "cafile") && f.KineCAFile != "/etc/k3s/pg-ca.pem" {
			t.Errorf("%q: datastore-cafile %q", tc.config, f.KineCAFile)
		}
	}
	root := t.TempDir()
	write(t, root, "/etc/rancher/k3s/config.yaml", "datastore-endpoint: https://10.0.0.7:2379,https://10.0.0.8:2379\ndatastore-cafile: /etc/etcd/ca.pem\ndatastore-certfile: /etc/etcd/client.pem\ndatastore-keyfile: /etc/etcd/client-key.pem\n")
	mkdir(t, root, "/var/lib/rancher/k3s/server")
	f, err := Find(root, "")
	want := []string{"--etcd-cafile=/etc/etcd/ca.pem", "--etcd-certfile=/etc/etcd/client.pem", "--etcd-keyfile=/etc/etcd/client-key.pem", "--etcd-servers=https://10.0.0.7:2379,https://10.0.0.8:2379", "--storage-backend=etcd3"}
	if err != nil || !reflect.DeepEqual(f.CommandLine, want) || f.EtcdDataDir != "" {
		t.Fatalf("external etcd: %+v %v", f, err)
	}
}
