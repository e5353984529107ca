package installer

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
)

// k3s's documented places: the server's configuration file and its .d
// directory, the systemd unit its install script writes (ExecStart's
// flags, its EnvironmentFile), and the data directory.
const (
	k3sConfig  = "/etc/rancher/k3s/config.yaml"
	k3sUnit    = "/etc/systemd/system/k3s.service"
	k3sDataDir = "/var/lib/rancher/k3s"
	// k3sEtcdEndpoint is where a k3s server's kube-apiserver reaches its
	// embedded etcd member (k3s's pkg/etcd).
	k3sEtcdEndpoint = "https://127.0.0.1:2379"
)

// k3s server flags the tool reads, and how they are given on a command line.
var (
	k3sValueFlags = map[string]bool{"config": true, "data-dir": true, "server": true, "token": true, "datastore-endpoint": true,
		"datastore-cafile": true, "datastore-certfile": true, "datastore-keyfile": true, "kube-apiserver-arg": true, "etcd-arg": true}
	k3sLists   = map[string]bool{"kube-apiserver-arg": true, "etcd-arg": true}
	k3sAliases = map[string]string{"c": "config", "d": "data-dir", "s": "server", "t": "token"}
	// k3sEnv are the flags the tool reads that k3s also takes from the
	// environment (its K3S_* variables), for a flag set nowhere else.
	k3sEnv = map[string]string{"datastore-endpoint": "K3S_DATASTORE_ENDPOINT", "datastore-cafile": "K3S_DATASTORE_CAFILE",
		"datastore-certfile": "K3S_DATASTORE_CERTFILE", "datastore-keyfile": "K3S_DATASTORE_KEYFILE", "cluster-init": "K3S_CLUSTER_INIT", "server": "K3S_URL"}
)

// findK3s finds a k3s server: its data directory's server/ (an agent has
// none). kube-apiserver runs inside the k3s process, with a command line k3s
// builds (pkg/daemons/control): its defaults for the datastore and the
// encryption configuration, then each kube-apiserver-arg ("flag=value"
// replaces k3s's value, "flag+=value" appends to it, "flag-=value" puts it
// first). Only the datastore's and the encryption's defaults are built: the
// others do not decide what is stored.
func findK3s(root string) (*Found, []string, error) {
	unit, hasUnit, err := readSystemdUnit(root, k3sUnit)
	if err != nil {
		return nil, nil, err
	}
	var cliArgs []string
	if hasUnit {
		if args, ok := unit.subcommandArgs("server"); ok {
			cliArgs = args
		} else {
			hasUnit = false // an agent's unit
		}
	}
	var cli settings
	cli.readCommandLine(cliArgs, k3sValueFlags, k3sLists, k3sAliases)
	config := k3sConfig
	if c := cli.scalar("config"); c != "" {
		config = c
	}
	if c := unit.env["K3S_CONFIG_FILE"]; hasUnit && c != "" {
		config = c // k3s takes the variable before the flag
	}
	var s settings
	if _, err := s.readConfigFiles(root, config); err != nil {
		return nil, nil, err
	}
	files := append([]string(nil), s.files...)
	if hasUnit {
		files = append(files, unit.file)
	}
	for k, v := range cli.values {
		s.set(k, v, k3sLists[k])
	}
	for flag, env := range k3sEnv {
		if v, ok := unit.env[env]; hasUnit && ok && !s.has(flag) {
			s.set(flag, []string{v}, false)
		}
	}
	dataDir := rancherDataDir(&s, k3sDataDir)
	serverDir := under(root, filepath.Join(dataDir, "server"))
	looked := []string{under(root, config), under(root, config+".d"), under(root, k3sUnit), serverDir}
	if !dirExists(serverDir) {
		return nil, looked, nil
	}
	if len(files) == 0 {
		files = []string{serverDir + " (k3s's defaults: no configuration file)"}
	}
	f := &Found{Installer: K3s, Files: files}
	etcdDir := filepath.Join(dataDir, "server/db/etcd")
	tls := func(name string) string { return filepath.Join(dataDir, "server/tls/etcd", name) }
	defaults := map[string]string{"storage-backend": "etcd3"}
	ep := s.scalar("datastore-endpoint")
	switch {
	case ep != "" && !isEtcdEndpoint(ep):
		return nil, looked, &UnsupportedError{Installer: K3s, Files: files,
			Reason: fmt.Sprintf("its datastore-endpoint is %s through kine, not etcd: the tool reads and writes etcd only", datastoreKind(ep))}
	case ep != "":
		f.Datastore = "an external etcd, its datastore-endpoint"
		defaults["etcd-servers"] = ep
		for flag, ds := range map[string]string{"etcd-cafile": "datastore-cafile", "etcd-certfile": "datastore-certfile", "etcd-keyfile": "datastore-keyfile"} {
			if v := s.scalar(ds); v != "" {
				defaults[flag] = v
			}
		}
		f.Notes = append(f.Notes, "note: k3s stores into an external etcd (datastore-endpoint): its data directory is on the etcd hosts")
	case s.flag("disable-etcd"):
		return nil, looked, &UnsupportedError{Installer: K3s, Files: files,
			Reason: "this server runs no etcd (disable-etcd: a control-plane-only server, its kube-apiserver reaches etcd through k3s's own proxy): run the tool on a server with the etcd role"}
	case dirExists(under(root, etcdDir)) || s.flag("cluster-init"):
		f.Datastore = "embedded etcd"
		defaults["etcd-servers"] = k3sEtcdEndpoint
		defaults["etcd-cafile"] = tls("server-ca.crt")
		defaults["etcd-certfile"] = tls("client.crt")
		defaults["etcd-keyfile"] = tls("client.key")
		f.EtcdDataDir, f.EtcdDataDirFrom = under(root, etcdDir), "k3s's data-dir"
	default:
		return nil, looked, &UnsupportedError{Installer: K3s, Files: files,
			Reason: fmt.Sprintf("it keeps the cluster in SQLite through kine (%s; no embedded etcd in %s), not in etcd: the tool reads and writes etcd only",
				under(root, filepath.Join(dataDir, "server/db/state.db")), under(root, etcdDir))}
	}
	if s.flag("secrets-encryption") {
		defaults["encryption-provider-config"] = filepath.Join(dataDir, "server/cred/encryption-config.json")
		defaults["encryption-provider-config-automatic-reload"] = "true"
	}
	f.CommandLine = k3sArgs(defaults, s.list("kube-apiserver-arg"))
	if s.flag("disable-apiserver") {
		f.Notes = append(f.Notes, "note: kube-apiserver is disabled on this k3s server (disable-apiserver): its command line is read as k3s builds it when enabled")
	}
	f.Notes = append(f.Notes, "note: k3s runs kube-apiserver inside its own binary: no image names the release (k3s --version on the node does)")
	return f, looked, nil
}

// k3sArgs is kube-apiserver's command line from k3s's defaults and the
// kube-apiserver-arg values, as k3s combines them: sorted by flag, a
// flag's values in the order given.
func k3sArgs(defaults map[string]string, extra []string) []string {
	initial := map[string]string{}
	for k, v := range defaults {
		initial[k] = v
	}
	values := map[string][]string{}
	for _, a := range extra {
		name, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			v = "true"
		}
		key := strings.TrimRight(name, "+-")
		def, hasDef := initial[key]
		var vals []string
		switch {
		case strings.HasSuffix(name, "+"): // after k3s's value
			if hasDef {
				vals = append(vals, def)
			}
			vals = append(append(vals, values[key]...), v)
		case strings.HasSuffix(name, "-"): // before it
			vals = append(vals, v)
			if hasDef {
				vals = append(vals, def)
			}
			vals = append(vals, values[key]...)
		default: // instead of it
			vals = append(append(vals, values[key]...), v)
		}
		delete(initial, key)
		values[key] = vals
	}
	for k, v := range initial {
		values[k] = []string{v}
	}
	keys := make([]string, 0, len(values))
	for k := range values {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var args []string
	for _, k := range keys {
		for _, v := range values[k] {
			args = append(args, "--"+k+"="+v)
		}
	}
	return args
}
