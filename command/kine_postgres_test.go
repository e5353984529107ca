package command

import (
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/internal/testrig/testkine"
	"kube-etcd-migrate/internal/testrig/testpg"
)

// k3sPostgresNode lays out a k3s server node whose datastore-endpoint is a
// real PostgreSQL server's database (testpg), kine's datastore made and
// seeded in it as kube-apiserver writes (testkine.SeedPG); encryption, when
// set, is k3s's secrets-encryption configuration. It returns the node's
// root and the database's DSN.
func k3sPostgresNode(t *testing.T, encryption string, seed func(*clientv3.Client)) (root, dsn string) {
	t.Helper()
	dsn = testpg.Start(t)
	testkine.SeedPG(t, dsn, seed)
	root = t.TempDir()
	config := fmt.Sprintf("datastore-endpoint: %q\n", dsn)
	if encryption != "" {
		config += "secrets-encryption: true\n"
		nodeWrite(t, root, "/var/lib/rancher/k3s/server/cred/encryption-config.json", []byte(encryption))
	}
	nodeWrite(t, root, "/etc/rancher/k3s/config.yaml", []byte(config))
	nodeWrite(t, root, "/var/lib/rancher/k3s/server/token", nil)
	return root, dsn
}
