package installer

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzK3sConfiguration: no configuration file, drop-in or systemd unit an
// operator's node holds makes the search for k3s panic; whatever it reads is
// a k3s found (with a command line) or an error.
func FuzzK3sConfiguration(f *testing.F) {
	f.Add([]byte("cluster-init: true\nsecrets-encryption: true\nkube-apiserver-arg:\n- etcd-prefix=/k3s\n- feature-gates+=A=true\n"), []byte("kube-apiserver-arg+: [etcd-servers-=https://10.0.0.1:2379]\ndata-dir: /srv/k3s\n"),
		[]byte("[Service]\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\nExecStart=/usr/local/bin/k3s \\\n    server \\\n\t'--cluster-init' --data-dir /var/lib/rancher/k3s\n"))
	f.Add([]byte("datastore-endpoint: mysql://u:p@tcp(db:3306)/k3s\n"), []byte(""), []byte("ExecStart=/usr/local/bin/k3s agent --server https://a:6443\n"))
	f.Add([]byte("kube-apiserver-arg: 12\ntoken: [1, {a: b}]\n"), []byte("- a\n- b\n"), []byte("ExecStart=k3s server --kube-apiserver-arg\nEnvironment=\"K3S_CONFIG_FILE=/etc/rancher/k3s/other.yaml\" 'X=\n"))
	f.Fuzz(func(t *testing.T, config, dropin, unit []byte) {
		root := t.TempDir()
		for p, data := range map[string][]byte{"/etc/rancher/k3s/config.yaml": config, "/etc/rancher/k3s/config.yaml.d/10-x.yaml": dropin, "/etc/systemd/system/k3s.service": unit} {
			if err := os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, p), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{"/var/lib/rancher/k3s/server/db/etcd", "/srv/k3s/server"} {
			if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		f, err := Find(root, K3s)
		if err == nil && (f == nil || len(f.CommandLine) == 0) {
			t.Fatalf("k3s found without a command line: %+v", f)
		}
	})
}
