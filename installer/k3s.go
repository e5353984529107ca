package installer

import (
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"strings"
)

// k3s's documented places: the server's configuration file and its .d
// directory, the systemd unit its install script writes (ExecStart's
// flags, its EnvironmentFile), and the data directory.
const (
	k3sConfig  = "/etc/rancher/k3s/config.yaml"
	k3sUnit    = "k3s.service"
	k3sDataDir = "/var/lib/rancher/k3s"
)

// k3sEtcdEndpoint is where a k3s server's kube-apiserver reaches its
// embedded etcd member: https://LOOPBACK:2379, LOOPBACK the loopback address
// of the cluster's service CIDR's family (k3s's pkg/etcd getEndpoints and
// pkg/daemons/config Control.Loopback).
func k3sEtcdEndpoint(loopback string) string { return "https://" + loopback + ":2379" }

// rancherServer is k3s or RKE2 as its command line reads its settings (RKE2
// runs k3s's server code: the same flags, configuration files and
// variables, its own names).
type rancherServer struct {
	installer Name
	config    string // the configuration file
	unit      string // the systemd unit
	envPrefix string // of its variables: K3S, RKE2
}

// rancher server flags the tool reads, and how they are given on a command line.
var (
	rancherValueFlags = map[string]bool{"config": true, "data-dir": true, "server": true, "token": true, "datastore-endpoint": true,
		"datastore-cafile": true, "datastore-certfile": true, "datastore-keyfile": true, "kube-apiserver-arg": true, "etcd-arg": true,
		"service-cidr": true, "cluster-cidr": true, "node-ip": true}
	rancherLists   = map[string]bool{"kube-apiserver-arg": true, "etcd-arg": true, "service-cidr": true, "cluster-cidr": true, "node-ip": true}
	rancherAliases = map[string]string{"c": "config", "d": "data-dir", "s": "server", "t": "token", "i": "node-ip"}
	// rancherEnv are the flags the tool reads that k3s and RKE2 also take
	// from the environment (PREFIX_NAME), for a flag set nowhere else.
	rancherEnv = map[string]string{"datastore-endpoint": "DATASTORE_ENDPOINT", "datastore-cafile": "DATASTORE_CAFILE",
		"datastore-certfile": "DATASTORE_CERTFILE", "datastore-keyfile": "DATASTORE_KEYFILE", "cluster-init": "CLUSTER_INIT",
		"server": "URL", "data-dir": "DATA_DIR", "node-ip": "NODE_IP"}
)

// rancherSettings are a k3s or RKE2 server's settings as found.
type rancherSettings struct {
	settings
	// config is the configuration file named (by PREFIX_CONFIG_FILE, the
	// unit's --config, or the default).
	config string
	// files are the files read: the configuration files, then the unit's.
	files []string
	// looked are the places looked at for the settings.
	looked []string
	// unit is the server's systemd unit, when there is one that runs the
	// server.
	unit    systemdUnit
	hasUnit bool
}

// read merges a server's settings under root as its command line does:
// PREFIX_CONFIG_FILE (from the unit's environment: Environment= of the unit
// and its drop-ins, its EnvironmentFile= files) or the unit's --config
// names the configuration file (the variable first, as k3s's configfilearg
// takes it); the file and its .d directory, then the unit's ExecStart flags
// after "server", then the unit's environment for a flag set nowhere else.
func (p rancherServer) read(root string) (*rancherSettings, error) {
	unit, hasUnit, err := readSystemdUnit(root, p.unit)
	if err != nil {
		return nil, err
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
	cli.readCommandLine(cliArgs, rancherValueFlags, rancherLists, rancherAliases)
	rs := &rancherSettings{config: p.config, unit: unit, hasUnit: hasUnit}
	if c := cli.scalar("config"); c != "" {
		rs.config = c
	}
	if c := unit.env[p.envPrefix+"_CONFIG_FILE"]; hasUnit && c != "" {
		rs.config = c // k3s takes the variable before the flag
	}
	if _, err := rs.readConfigFiles(root, rs.config); err != nil {
		return nil, err
	}
	rs.files = append([]string(nil), rs.settings.files...)
	if hasUnit {
		rs.files = append(rs.files, unit.files(root)...)
	}
	for k, v := range cli.values {
		rs.set(k, v, rancherLists[k])
	}
	for flag, env := range rancherEnv {
		if v, ok := unit.env[p.envPrefix+"_"+env]; hasUnit && ok && !rs.has(flag) {
			rs.set(flag, []string{v}, false)
		}
	}
	rs.looked = []string{under(root, rs.config), under(root, rs.config+".d")}
	for _, d := range systemdUnitDirs {
		rs.looked = append(rs.looked, under(root, filepath.Join(d, p.unit)))
		if hasUnit {
			break // the first one found
		}
	}
	if hasUnit {
		rs.looked[len(rs.looked)-1] = unit.file
	}
	return rs, nil
}

var k3sServer = rancherServer{installer: K3s, config: k3sConfig, unit: k3sUnit, envPrefix: "K3S"}

// findK3s finds a k3s server: its data directory's server/ (an agent has
// none). kube-apiserver runs inside the k3s process, with a command line k3s
// builds (pkg/daemons/control): its defaults for the datastore and the
// encryption configuration, then each kube-apiserver-arg ("flag=value"
// replaces k3s's value, "flag+=value" appends to it, "flag-=value" puts it
// first). Only the datastore's and the encryption's defaults are built: the
// others do not decide what is stored.
func findK3s(root string) (*Found, []string, error) {
	rs, err := k3sServer.read(root)
	if err != nil {
		return nil, nil, err
	}
	s := &rs.settings
	files := rs.files
	dataDir := rancherDataDir(s, k3sDataDir)
	serverDir := under(root, filepath.Join(dataDir, "server"))
	looked := append(rs.looked, serverDir)
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
	case sqliteEndpoint(ep) != "":
		// A datastore-endpoint naming the SQLite file (kine's
		// sqlite://PATH?PARAMS): served as k3s's default one is.
		f.KineDatabase = under(root, sqliteEndpoint(ep))
		f.Datastore = "SQLite through kine, " + f.KineDatabase + " (its datastore-endpoint)"
		defaults["etcd-servers"] = "unix://" + filepath.Join(dataDir, "server/kine.sock")
		f.Notes = append(f.Notes, "note: k3s keeps this cluster in SQLite (its datastore-endpoint): the tool serves it through kine in its own process, with k3s stopped")
	case ServerDatabase(ep) != "":
		// kine's PostgreSQL (postgres:// or postgresql://) or MySQL
		// (mysql://), shared by every k3s server of the cluster; k3s hands
		// kine the datastore-cafile, -certfile and -keyfile.
		kind := datastoreKind(ep)
		f.KineDSN = ep
		f.KineCAFile, f.KineCertFile, f.KineKeyFile = s.scalar("datastore-cafile"), s.scalar("datastore-certfile"), s.scalar("datastore-keyfile")
		f.Datastore = kind + " through kine, the " + ServerDatabase(ep) + " (its datastore-endpoint)"
		defaults["etcd-servers"] = "unix://" + filepath.Join(dataDir, "server/kine.sock")
		f.Notes = append(f.Notes, "note: k3s keeps this cluster in "+kind+" (its datastore-endpoint): the tool serves it through kine in its own process, with every k3s server of the cluster stopped")
	case ep != "" && !isEtcdEndpoint(ep):
		return nil, looked, &UnsupportedError{Installer: K3s, Files: files,
			Reason: notKineReason(ep)}
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
		loopback, from := k3sLoopback(s)
		defaults["etcd-servers"] = k3sEtcdEndpoint(loopback)
		if from != "" {
			f.Notes = append(f.Notes, fmt.Sprintf("note: k3s's embedded etcd is reached at %s: the loopback of %s", loopback, from))
		}
		defaults["etcd-cafile"] = tls("server-ca.crt")
		defaults["etcd-certfile"] = tls("client.crt")
		defaults["etcd-keyfile"] = tls("client.key")
		f.EtcdDataDir, f.EtcdDataDirFrom = under(root, etcdDir), "k3s's data-dir"
	default:
		// k3s's default: kine over SQLite (k3s pkg/cluster: no etcd
		// directory and no cluster-init), the database at
		// DATA/server/db/state.db, kube-apiserver reaching kine at
		// unix://kine.sock in DATA/server.
		f.KineDatabase = under(root, filepath.Join(dataDir, "server/db/state.db"))
		f.Datastore = "SQLite through kine, " + f.KineDatabase
		defaults["etcd-servers"] = "unix://" + filepath.Join(dataDir, "server/kine.sock")
		f.Notes = append(f.Notes, fmt.Sprintf("note: k3s keeps this cluster in SQLite (no embedded etcd in %s): the tool serves it through kine in its own process, with k3s stopped", under(root, etcdDir)))
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

// k3sLoopback is the loopback address k3s's embedded etcd listens on and
// its kube-apiserver reaches it at: "[::1]" when the cluster's first service
// CIDR is IPv6 (k3s's Control.Loopback reads ServiceIPRange, the first
// entry of service-cidr), else "127.0.0.1". Without a service-cidr, k3s
// takes its default (10.43.0.0/16, or fd00:43::/112 for an IPv6 node) from
// the family of the node's first IP: node-ip, when it is set (otherwise the
// host's default interface, which no file names). from says which setting
// made it IPv6 ("" for IPv4).
func k3sLoopback(s *settings) (loopback, from string) {
	if cidrs := splitList(s.list("service-cidr")); len(cidrs) > 0 {
		if ip, _, err := net.ParseCIDR(cidrs[0]); err == nil && ip.To4() == nil {
			return "[::1]", "service-cidr " + cidrs[0]
		}
		return "127.0.0.1", ""
	}
	if ips := splitList(s.list("node-ip")); len(ips) > 0 {
		if ip := net.ParseIP(ips[0]); ip != nil && ip.To4() == nil {
			return "[::1]", "node-ip " + ips[0] + " (no service-cidr: k3s's IPv6 default, fd00:43::/112)"
		}
	}
	return "127.0.0.1", ""
}

// splitList is a list flag's values with comma-separated ones split, as
// k3s's util.SplitStringSlice does.
func splitList(vals []string) []string {
	var out []string
	for _, v := range vals {
		for _, e := range strings.Split(v, ",") {
			if e = strings.TrimSpace(e); e != "" {
				out = append(out, e)
			}
		}
	}
	return out
}
