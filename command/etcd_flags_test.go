package command

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testpki"
)

// parseEtcdArgs runs a cli app with etcdFlags and returns what
// etcdOptions.config, then etcdscan.Config.Validate, made of args.
func parseEtcdArgs(t *testing.T, args ...string) (etcdscan.Config, error) {
	t.Helper()
	var cfg etcdscan.Config
	var cerr error
	app := &cli.App{
		Name:  "x",
		Flags: etcdFlags(),
		Action: func(c *cli.Context) error {
			cfg, cerr = newEtcdOptions(c).config()
			if cerr == nil {
				cerr = etcdError(cfg.Validate()) // as etcdConfig: the flag named
			}
			return nil
		},
	}
	if err := app.Run(append([]string{"x"}, args...)); err != nil {
		t.Fatalf("cli: %v", err)
	}
	return cfg, cerr
}

func clearEtcdctlEnv(t *testing.T) {
	for _, v := range []string{"ENDPOINTS", "CACERT", "CERT", "KEY", "USER", "PASSWORD", "DIAL_TIMEOUT", "COMMAND_TIMEOUT"} {
		t.Setenv("ETCDCTL_"+v, "")
		os.Unsetenv("ETCDCTL_" + v)
	}
}

func TestEtcdFlagsDefaultsAndEnv(t *testing.T) {
	clearEtcdctlEnv(t)
	// No default endpoint: without one, the cluster is the node's, found
	// from its installer's files (TestDiscovery*), never etcdctl's
	// 127.0.0.1:2379 by default.
	cfg, err := parseEtcdArgs(t)
	if err == nil || !strings.HasPrefix(err.Error(), "--endpoints: ") || len(cfg.Endpoints) != 0 || cfg.DialTimeout != 2*time.Second || cfg.CommandTimeout != 5*time.Second {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}

	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "client", false)
	t.Setenv("ETCDCTL_ENDPOINTS", "10.0.0.1:2379,https://10.0.0.2:2379")
	t.Setenv("ETCDCTL_CACERT", ca.File)
	t.Setenv("ETCDCTL_CERT", cert)
	t.Setenv("ETCDCTL_KEY", key)
	t.Setenv("ETCDCTL_DIAL_TIMEOUT", "7s")
	t.Setenv("ETCDCTL_COMMAND_TIMEOUT", "1m")
	cfg, err = parseEtcdArgs(t)
	if err != nil {
		t.Fatal(err)
	}
	// (etcdscan's TestEndpointSchemes: these get https://, --cacert given.)
	if strings.Join(cfg.Endpoints, " ") != "10.0.0.1:2379 https://10.0.0.2:2379" {
		t.Fatalf("endpoints from env: %v", cfg.Endpoints)
	}
	if cfg.CACert != ca.File || cfg.Cert != cert || cfg.Key != key || cfg.DialTimeout != 7*time.Second || cfg.CommandTimeout != time.Minute {
		t.Fatalf("env fallback: %+v", cfg)
	}

	// Flags win over the environment; a repeated --endpoints replaces the default.
	cfg, err = parseEtcdArgs(t, "--endpoints", "a:1", "--endpoints", "b:2,c:3", "--dial-timeout", "3s")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.Endpoints, " ") != "a:1 b:2 c:3" || cfg.DialTimeout != 3*time.Second {
		t.Fatalf("flags: %+v", cfg)
	}
}

func TestEtcdFlagsValidation(t *testing.T) {
	clearEtcdctlEnv(t)
	dir := t.TempDir()
	ca := testpki.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, dir, "client", false)
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--cert", cert}, "--cert"},
		{[]string{"--key", key}, "--key"},
		{[]string{"--cacert", missing}, "--cacert"},
		{[]string{"--cacert", key}, "--cacert"},
		{[]string{"--cert", missing, "--key", key}, "--cert"},
		{[]string{"--cert", cert, "--key", missing}, "--key"},
		{[]string{"--cert", key, "--key", cert}, "--cert/--key"},
		{[]string{"--dial-timeout", "0s"}, "--dial-timeout"},
		{[]string{"--password", "x"}, "--password"},
	} {
		_, err := parseEtcdArgs(t, append([]string{"--endpoints", "127.0.0.1:2379"}, tc.args...)...)
		if err == nil || !strings.HasPrefix(err.Error(), tc.want+":") {
			t.Errorf("%v: got error %v, want one starting with %q", tc.args, err, tc.want)
		}
	}
	cfg, err := parseEtcdArgs(t, "--endpoints", "127.0.0.1:2379", "--user", "root:secret")
	if err != nil || cfg.Username != "root" || cfg.Password != "secret" {
		t.Fatalf("--user name:password: %+v %v", cfg, err)
	}
}
