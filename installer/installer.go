// Package installer finds, without flags, the cluster a control-plane node
// runs: which installer laid the node out — kubeadm, kops, RKE2 or k3s with
// its embedded etcd — and where, in that installer's documented places, is
// kube-apiserver's configuration (its static-pod manifest; for k3s, which
// runs kube-apiserver inside its own process, the command line k3s builds
// from its configuration files), etcd's manifest and data directory. It
// reads files only, under a root directory that is "/" on the node itself
// and may be a node's disk mounted elsewhere; it finds a kube-apiserver
// stopped the runbooks' way too (its manifest moved out of the kubelet's
// directory, or k3s's apiserver disabled). A node with none of them, or
// more than one, is an error listing every place looked at; so is a k3s
// whose datastore is not etcd. What it returns is plain data for package
// apiserverconfig to read as the operator's own --apiserver-manifest.
package installer

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/internal/input"
)

// Name is an installer the tool knows the layout of.
type Name string

const (
	Kubeadm Name = "kubeadm"
	Kops    Name = "kops"
	RKE2    Name = "rke2"
	K3s     Name = "k3s"
)

// Names are the installers, in the order they are looked for.
var Names = []Name{Kubeadm, Kops, RKE2, K3s}

// Parse is the installer s names ("" for none).
func Parse(s string) (Name, error) {
	if s == "" {
		return "", nil
	}
	for _, n := range Names {
		if string(n) == s {
			return n, nil
		}
	}
	return "", fmt.Errorf("%q: want one of %s", s, namesList(Names, ", "))
}

func namesList(ns []Name, sep string) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = string(n)
	}
	return strings.Join(s, sep)
}

// Found is one installer's control plane on the node. Paths are as read:
// under the root.
type Found struct {
	Installer Name
	Root      string
	// Manifest is kube-apiserver's static-pod manifest (kubeadm, kops,
	// RKE2); Parked says it is where the runbooks move it to stop
	// kube-apiserver (out of the kubelet's directory, KubeletDir).
	Manifest   string
	Parked     bool
	KubeletDir string
	// CommandLine is kube-apiserver's command line as k3s builds it (k3s:
	// no manifest), from the files in Files.
	CommandLine []string
	Files       []string
	// EtcdManifest is etcd's static-pod manifest on this node, "" when none.
	EtcdManifest string
	// EtcdDataDir is this node's etcd member's data directory, "" when it is
	// not known (EtcdDataDirFrom says where it was read).
	EtcdDataDir     string
	EtcdDataDirFrom string
	// Datastore says what kube-apiserver stores into (k3s's embedded etcd,
	// an external etcd), "" for a static pod's (its --etcd-servers).
	Datastore string
	// KineDatabase is the SQLite file k3s or RKE2 keeps the cluster in
	// through kine, "" when it stores into etcd.
	KineDatabase string
	// KineDSN is the PostgreSQL or MySQL database k3s or RKE2 keeps the
	// cluster in through kine (KineKind says which): its datastore-endpoint as written, credentials and all
	// (never printed: Datastore names it without them), "" when none.
	// KineCAFile, KineCertFile and KineKeyFile are its datastore-cafile,
	// -certfile and -keyfile, the TLS kine connects with.
	KineDSN                               string
	KineCAFile, KineCertFile, KineKeyFile string
	// Notes are what the operator should know of what was found (a
	// kube-apiserver disabled, a second copy of the manifest, how the
	// release is known).
	Notes []string
}

// What is the one line the commands print: the installer and the files
// read. It names files, never their contents.
func (f *Found) What() string {
	var b strings.Builder
	fmt.Fprintf(&b, "found %s on this node", f.Installer)
	if f.Root != "" && f.Root != "/" {
		fmt.Fprintf(&b, " (under %s)", f.Root)
	}
	switch {
	case f.Manifest != "" && f.Parked:
		fmt.Fprintf(&b, ": kube-apiserver's manifest %s (parked out of %s: kube-apiserver stopped)", f.Manifest, f.KubeletDir)
	case f.Manifest != "":
		fmt.Fprintf(&b, ": kube-apiserver's manifest %s", f.Manifest)
		if f.OnKine() {
			fmt.Fprintf(&b, " (%s)", f.Datastore)
		}
	default:
		fmt.Fprintf(&b, ": kube-apiserver's command line as k3s builds it from %s", strings.Join(f.Files, ", "))
		if f.Datastore != "" {
			fmt.Fprintf(&b, " (%s)", f.Datastore)
		}
	}
	if f.EtcdManifest != "" {
		fmt.Fprintf(&b, "; etcd's manifest %s", f.EtcdManifest)
	}
	switch {
	case f.OnKine():
		// no etcd: the datastore is named above
	case f.EtcdDataDir != "":
		fmt.Fprintf(&b, "; etcd's data directory %s (%s)", f.EtcdDataDir, f.EtcdDataDirFrom)
	default:
		b.WriteString("; etcd's data directory not known on this node")
	}
	return b.String()
}

// OnKine says whether the cluster is kept through kine (SQLite,
// PostgreSQL or MySQL), not in etcd.
func (f *Found) OnKine() bool { return f.KineDatabase != "" || f.KineDSN != "" }

// KineKind is the database the cluster is kept in through kine: "SQLite",
// "PostgreSQL" or "MySQL"; "" when it is kept in etcd.
func (f *Found) KineKind() string {
	switch {
	case f.KineDSN != "":
		return datastoreKind(f.KineDSN)
	case f.KineDatabase != "":
		return "SQLite"
	}
	return ""
}

// Place is where an installer's files are looked for.
type Place struct {
	Installer Name
	Paths     []string
}

// finder looks for one installer's control plane under root: nil when its
// files are not there.
type finder func(root string) (*Found, []string, error)

var finders = map[Name]finder{Kubeadm: findKubeadm, Kops: findKops, RKE2: findRKE2, K3s: findK3s}

// Find looks for every installer's control plane under root ("" = "/"),
// or only's when it is set, and returns the one found.
func Find(root string, only Name) (*Found, error) {
	if root == "" {
		root = "/"
	}
	names := Names
	if only != "" {
		names = []Name{only}
	}
	var found []*Found
	var looked []Place
	for _, n := range names {
		f, paths, err := finders[n](root)
		looked = append(looked, Place{Installer: n, Paths: paths})
		if err != nil {
			return nil, err
		}
		if f != nil {
			f.Root = root
			found = append(found, f)
		}
	}
	switch len(found) {
	case 0:
		return nil, &NotFoundError{Root: root, Looked: looked, Only: only}
	case 1:
		return found[0], nil
	}
	return nil, &AmbiguousError{Found: found}
}

// NotFoundError: none of the installers' files is on the node.
type NotFoundError struct {
	Root   string
	Looked []Place
	Only   Name
}

func (e *NotFoundError) Error() string { return e.Render(input.Words) }

// Render is the message with the inputs that name a cluster spelled by spell.
func (e *NotFoundError) Render(spell func(input.Name) string) string {
	var parts []string
	for _, p := range e.Looked {
		parts = append(parts, fmt.Sprintf("%s (%s)", p.Installer, strings.Join(p.Paths, ", ")))
	}
	what := "no control plane found on this node"
	if e.Only != "" {
		what = fmt.Sprintf("no %s control plane found on this node", e.Only)
	}
	return fmt.Sprintf("%s: looked for %s; name the cluster with %s, %s or %s (with %s, %s, %s)",
		what, strings.Join(parts, "; "), spell(input.APIServerManifest), spell(input.APIServerFlagsFile), spell(input.Endpoints), spell(input.CACert), spell(input.ClientCert), spell(input.ClientKey))
}

// AmbiguousError: more than one installer's files are on the node.
type AmbiguousError struct{ Found []*Found }

func (e *AmbiguousError) Error() string { return e.Render(input.Words) }

// Render is the message with the inputs that pick one spelled by spell.
func (e *AmbiguousError) Render(spell func(input.Name) string) string {
	var parts []string
	var names []Name
	for _, f := range e.Found {
		what := f.Manifest
		if what == "" {
			what = strings.Join(f.Files, ", ")
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", f.Installer, what))
		names = append(names, f.Installer)
	}
	return fmt.Sprintf("more than one control plane found on this node: %s; pick one with %s %s, or name the cluster with %s, %s or %s",
		strings.Join(parts, "; "), spell(input.Distribution), namesList(names, "|"), spell(input.APIServerManifest), spell(input.APIServerFlagsFile), spell(input.Endpoints))
}

// UnsupportedError: an installer's control plane whose kube-apiserver does
// not store into an etcd the tool can reach from this node, nor into SQLite
// it can serve through kine (k3s or RKE2 on kine's NATS or another
// database; a k3s server without etcd).
type UnsupportedError struct {
	Installer Name
	Files     []string
	Reason    string
}

func (e *UnsupportedError) Error() string { return e.Render(input.Words) }

// Render is the message with the inputs that name a cluster spelled by spell.
func (e *UnsupportedError) Render(spell func(input.Name) string) string {
	return fmt.Sprintf("found %s on this node (%s), but %s", e.Installer, strings.Join(e.Files, ", "), e.Reason)
}

// ManifestConflictError: kube-apiserver's manifest is both in the
// kubelet's directory and where the runbooks park it, and the two differ.
type ManifestConflictError struct {
	Installer      Name
	Live, Parked   string
	LiveDir, Where string
}

func (e *ManifestConflictError) Error() string { return e.Render(input.Words) }

// Render is the message with the manifest's input spelled by spell.
func (e *ManifestConflictError) Render(spell func(input.Name) string) string {
	return fmt.Sprintf("found %s on this node with two different kube-apiserver manifests: %s (the kubelet runs it) and %s (a copy parked out of %s); remove the stale one, or name the one kube-apiserver runs with with %s",
		e.Installer, e.Live, e.Parked, e.LiveDir, spell(input.APIServerManifest))
}

// under is path p of the node, as read under root.
func under(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	return filepath.Join(root, p)
}

func exists(p string) (bool, error) {
	_, err := os.Stat(p)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return false, nil
	}
	return false, err
}

// staticPod finds kube-apiserver's manifest in the kubelet's directory
// (live) or where the runbooks park it (parked); both there and the same,
// the live one, with a note; both there and different, an error.
func staticPod(installer Name, root, live, parked string) (f *Found, err error) {
	lp, pp := under(root, live), under(root, parked)
	liveOK, err := exists(lp)
	if err != nil {
		return nil, err
	}
	parkedOK, err := exists(pp)
	if err != nil {
		return nil, err
	}
	f = &Found{Installer: installer, KubeletDir: under(root, filepath.Dir(live))}
	switch {
	case liveOK && parkedOK:
		a, err := os.ReadFile(lp)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(pp)
		if err != nil {
			return nil, err
		}
		if !bytes.Equal(a, b) {
			return nil, &ManifestConflictError{Installer: installer, Live: lp, Parked: pp, LiveDir: f.KubeletDir}
		}
		f.Manifest = lp
		f.Notes = append(f.Notes, fmt.Sprintf("note: %s is also there, the same as the kubelet's %s (a copy left from an earlier window?)", pp, lp))
	case liveOK:
		f.Manifest = lp
	case parkedOK:
		f.Manifest, f.Parked = pp, true
	default:
		return nil, nil
	}
	return f, nil
}

// etcdPod fills f's etcd manifest and data directory from etcd's static
// pod (file, a path of the node), when there is one.
func (f *Found) etcdPod(root, file string) error {
	p := under(root, file)
	ok, err := exists(p)
	if err != nil || !ok {
		return err
	}
	pod, err := apiserverconfig.ReadEtcdPod(p, root)
	f.EtcdManifest = p
	if err != nil {
		f.Notes = append(f.Notes, fmt.Sprintf("warning: etcd's data directory is not known: %v", err))
		return nil
	}
	if pod.DataDir != "" {
		f.EtcdDataDir = pod.DataDir
		f.EtcdDataDirFrom = "etcd's manifest"
		if pod.ConfigFile != "" {
			f.EtcdDataDirFrom = "etcd's configuration " + pod.ConfigFile
		}
	}
	return nil
}

func findKubeadm(root string) (*Found, []string, error) {
	const live, parked = "/etc/kubernetes/manifests/kube-apiserver.yaml", "/etc/kubernetes/kube-apiserver.yaml"
	looked := []string{under(root, live), under(root, parked)}
	f, err := staticPod(Kubeadm, root, live, parked)
	if f == nil || err != nil {
		return nil, looked, err
	}
	if err := f.etcdPod(root, "/etc/kubernetes/manifests/etcd.yaml"); err != nil {
		return nil, looked, err
	}
	if f.EtcdManifest == "" {
		f.Notes = append(f.Notes, "note: no etcd static pod on this node (an external etcd): its data directory is on the etcd hosts")
	}
	return f, looked, nil
}

func findKops(root string) (*Found, []string, error) {
	const live, parked = "/etc/kubernetes/manifests/kube-apiserver.manifest", "/etc/kubernetes/kube-apiserver.manifest"
	looked := []string{under(root, live), under(root, parked)}
	f, err := staticPod(Kops, root, live, parked)
	if f == nil || err != nil {
		return nil, looked, err
	}
	// nodeup writes one manifest per etcd-manager cluster,
	// /etc/kubernetes/manifests/etcd-NAME-IG.manifest (kops nodeup/pkg/model/manifests.go;
	// main, events, and the optional leases and cilium). etcd-manager runs etcd
	// with its data on a volume of its own that it mounts itself: no file of
	// the node names it.
	mains, err := filepath.Glob(under(root, "/etc/kubernetes/manifests/etcd-main*.manifest"))
	if err != nil {
		return nil, looked, err
	}
	sort.Strings(mains)
	if len(mains) > 0 {
		f.EtcdManifest = mains[0]
	}
	vols, err := kopsEtcdVolumes(root)
	if err != nil {
		return nil, looked, err
	}
	if len(vols) > 0 {
		f.Notes = append(f.Notes, fmt.Sprintf("note: kops' etcd-manager keeps etcd's data on volumes of its own, which no file of the node names; mounted on this node: %s (check their room with df)", strings.Join(vols, ", ")))
	} else {
		f.Notes = append(f.Notes, "note: kops' etcd-manager keeps etcd's data on volumes of its own, which no file of the node names ("+strings.Join(kopsVolumePlaces, ", ")+"); none found on this node")
	}
	return f, looked, nil
}

// kopsVolumePlaces are where etcd-manager mounts its volumes
// (kopeio/etcd-manager pkg/volumes/mounter.go: /mnt/master-ID, or
// /mnt/disks/master-ID where /mnt/disks exists, as on ContainerOS;
// pkg/volumes/external/volumes.go, kops' bare metal: the pre-mounted
// /mnt/disks/CLUSTER--ETCD--N/mnt).
var kopsVolumePlaces = []string{"/mnt/master-*", "/mnt/disks/master-*", "/mnt/disks/*--*--*/mnt"}

// kopsEtcdVolumes are etcd-manager's volume directories on the node under
// root, sorted.
func kopsEtcdVolumes(root string) ([]string, error) {
	var out []string
	for _, g := range kopsVolumePlaces {
		m, err := filepath.Glob(under(root, g))
		if err != nil {
			return nil, err
		}
		for _, p := range m {
			if dirExists(p) {
				out = append(out, p)
			}
		}
	}
	sort.Strings(out)
	return out, nil
}

// rancherDataDir is a k3s or RKE2 server's data-dir, from its settings.
func rancherDataDir(s *settings, def string) string {
	if d := s.scalar("data-dir", "d"); d != "" {
		return d
	}
	return def
}

// rke2Server: RKE2's configuration file and the unit its tarball and RPM
// install (rancher/rke2 bundle/lib/systemd/system/rke2-server.service).
var rke2Server = rancherServer{installer: RKE2, config: "/etc/rancher/rke2/config.yaml", unit: "rke2-server.service", envPrefix: "RKE2"}

func findRKE2(root string) (*Found, []string, error) {
	rs, err := rke2Server.read(root)
	if err != nil {
		return nil, nil, err
	}
	s := &rs.settings
	dataDir := rancherDataDir(s, "/var/lib/rancher/rke2")
	live := filepath.Join(dataDir, "agent/pod-manifests/kube-apiserver.yaml")
	parked := filepath.Join(dataDir, "agent/kube-apiserver.yaml")
	looked := append([]string{under(root, live), under(root, parked)}, rs.looked...)
	f, err := staticPod(RKE2, root, live, parked)
	if f == nil || err != nil {
		return nil, looked, err
	}
	// RKE2 runs kine instead of etcd (rancher/rke2 pkg/rke2/rke2_linux.go,
	// initStaticPodExecutor) for a datastore-endpoint that is not etcd's
	// (http, https, unix, unixs), and for disable-etcd without server; its
	// kube-apiserver then reaches kine at unixs://DATA/server/kine.sock
	// (pkg/executor/staticpod/staticpod.go).
	refuse := func(reason string) error {
		return &UnsupportedError{Installer: RKE2, Files: append(append([]string(nil), rs.files...), f.Manifest), Reason: reason}
	}
	sqlite := under(root, filepath.Join(dataDir, "server/db/state.db"))
	kine, err := manifestEtcdServersKine(f.Manifest)
	if err != nil {
		return nil, looked, err
	}
	f.Files = rs.files
	switch ep := s.scalar("datastore-endpoint"); {
	case sqliteEndpoint(ep) != "":
		f.KineDatabase, f.Datastore = under(root, sqliteEndpoint(ep)), "SQLite through kine, its datastore-endpoint"
	case ServerDatabase(ep) != "":
		kind := datastoreKind(ep)
		f.KineDSN, f.Datastore = ep, kind+" through kine, the "+ServerDatabase(ep)+" (its datastore-endpoint)"
		f.KineCAFile, f.KineCertFile, f.KineKeyFile = s.scalar("datastore-cafile"), s.scalar("datastore-certfile"), s.scalar("datastore-keyfile")
		f.Notes = append(f.Notes, "note: RKE2 keeps this cluster in "+kind+" (its datastore-endpoint): the tool serves it through kine in its own process, with every RKE2 server of the cluster stopped")
		return f, looked, nil
	case ep != "" && !isEtcdEndpoint(ep):
		return nil, looked, refuse(notKineReason(ep))
	case ep == "" && s.flag("disable-etcd") && !s.has("server"):
		f.KineDatabase, f.Datastore = sqlite, "SQLite through kine (disable-etcd without server)"
	case ep == "" && kine != "":
		f.KineDatabase, f.Datastore = sqlite, fmt.Sprintf("SQLite through kine (--etcd-servers=%s: RKE2's kine socket)", kine)
	}
	if f.KineDatabase != "" {
		f.Datastore += ", " + f.KineDatabase
		f.Notes = append(f.Notes, "note: RKE2 keeps this cluster in SQLite: the tool serves it through kine in its own process, with RKE2 stopped")
		return f, looked, nil
	}
	if err := f.etcdPod(root, filepath.Join(dataDir, "agent/pod-manifests/etcd.yaml")); err != nil {
		return nil, looked, err
	}
	if f.EtcdDataDir == "" {
		if dir := under(root, filepath.Join(dataDir, "server/db/etcd")); dirExists(dir) {
			f.EtcdDataDir, f.EtcdDataDirFrom = dir, "RKE2's data-dir"
		}
	}
	return f, looked, nil
}

// manifestEtcdServersKine is the kube-apiserver manifest's --etcd-servers
// when it is RKE2's kine socket (a unix or unixs URL of a file named
// kine.sock), "" otherwise (or when the manifest cannot be read as a pod:
// apiserverconfig says why when it reads it).
func manifestEtcdServersKine(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var pod struct {
		Spec struct {
			Containers []struct {
				Command []string `json:"command"`
				Args    []string `json:"args"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if yaml.Unmarshal(data, &pod) != nil {
		return "", nil
	}
	for _, c := range pod.Spec.Containers {
		for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
			v, ok := strings.CutPrefix(a, "--etcd-servers=")
			if !ok {
				continue
			}
			for _, ep := range strings.Split(v, ",") {
				scheme, rest, _ := strings.Cut(strings.TrimSpace(ep), "://")
				if (scheme == "unix" || scheme == "unixs") && filepath.Base(rest) == "kine.sock" {
					return strings.TrimSpace(ep), nil
				}
			}
		}
	}
	return "", nil
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// isEtcdEndpoint reports whether a k3s/RKE2 datastore-endpoint is etcd's:
// its scheme (before the first "://", as kine's util.SchemeAndAddress
// splits it) is one kine's remote driver takes, which builds no database
// and hands the endpoint to kube-apiserver as it is (k3s-io/kine v0.16.4
// pkg/drivers/remote/remote.go: http, https, unix, unixs); RKE2 decides the
// same way (pkg/rke2/rke2_linux.go).
func isEtcdEndpoint(ep string) bool {
	scheme, _, ok := strings.Cut(ep, "://")
	if !ok {
		return false
	}
	switch scheme {
	case "http", "https", "unix", "unixs":
		return true
	}
	return false
}

// sqliteEndpoint is the database file a datastore-endpoint of kine's SQLite
// driver names (sqlite://PATH, parameters after "?" dropped; a relative
// path is taken from /, the working directory systemd gives the unit), ""
// for any other.
func sqliteEndpoint(ep string) string {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || scheme != "sqlite" { // kine's scheme, as kine matches it
		return ""
	}
	path, _, _ := strings.Cut(rest, "?")
	if path == "" {
		return ""
	}
	return filepath.Join("/", path)
}

// PostgresDatabase names the PostgreSQL database of a kine
// datastore-endpoint (postgres:// or postgresql://, kine's pgsql driver) without
// its credentials: "database DB on HOST" ("" for any other endpoint). As kine
// reads it: no database is "kubernetes", and the name is folded to lower case.
func PostgresDatabase(ep string) string {
	scheme, _, ok := strings.Cut(ep, "://")
	if !ok || (scheme != "postgres" && scheme != "postgresql") { // kine's schemes, as kine matches them
		return ""
	}
	host, db := "localhost", "kubernetes"
	if u, err := url.Parse(ep); err == nil {
		if u.Host != "" {
			host = u.Host
		}
		if h := u.Query().Get("host"); h != "" {
			host = h
		}
		if p := strings.Trim(u.Path, "/"); p != "" {
			db = strings.ToLower(p)
		}
	}
	return fmt.Sprintf("database %s on %s", db, host)
}

// MySQLDatabase names the MySQL (or MariaDB) database of a kine
// datastore-endpoint (mysql://, kine's mysql driver:
// mysql://USER:PASSWORD@tcp(HOST:PORT)/DB or unix(SOCKET)) without its
// credentials: "database DB on HOST" (the port when not 3306; a socket's
// path), "" for any other endpoint. As kine reads it: no database is
// "kubernetes".
func MySQLDatabase(ep string) string {
	scheme, rest, ok := strings.Cut(ep, "://")
	if !ok || scheme != "mysql" { // kine's scheme, as kine matches it
		return ""
	}
	c, err := mysql.ParseDSN(rest)
	if err != nil {
		// Its error may hold a piece of the DSN: not said here (serving it
		// says what is wrong, the password kept out).
		return "database of a DSN that does not parse"
	}
	db, host := c.DBName, c.Addr
	if db == "" {
		db = "kubernetes"
	}
	if c.Net == "tcp" {
		host = strings.TrimSuffix(host, ":3306")
	}
	return fmt.Sprintf("database %s on %s", db, host)
}

// ServerDatabase names the database of a kine datastore-endpoint kept by a
// database server the tool serves (PostgresDatabase, MySQLDatabase), ""
// for any other.
func ServerDatabase(ep string) string {
	if d := PostgresDatabase(ep); d != "" {
		return d
	}
	return MySQLDatabase(ep)
}

// DatastoreKind names a kine datastore-endpoint's database without its
// credentials: "PostgreSQL", "MySQL", "SQLite", "NATS"...
func DatastoreKind(ep string) string { return datastoreKind(ep) }

// notKineReason is why a datastore-endpoint that is not etcd's is not
// served: a database the tool does not serve through kine, or one it does
// whose scheme is not in kine's lowercase (SQLITE://, POSTGRES://,
// MySQL://...: kine matches its schemes exactly, and so neither k3s nor
// RKE2 would start on it).
func notKineReason(ep string) string {
	scheme, _, _ := strings.Cut(ep, "://")
	kind, lower := datastoreKind(ep), strings.ToLower(scheme)
	if scheme != lower && (kind == "MySQL" || kind == "PostgreSQL" || kind == "SQLite") {
		return fmt.Sprintf("its datastore-endpoint begins %s://, which kine does not take (its %s scheme is %s://, lowercase): neither this server nor the tool can serve it", scheme, kind, lower)
	}
	return fmt.Sprintf("its datastore-endpoint is %s through kine, not etcd: the tool works on etcd, and on SQLite, PostgreSQL and MySQL through kine", kind)
}

// datastoreKind names a kine datastore-endpoint's database without its
// credentials (a DSN holds the password).
func datastoreKind(ep string) string {
	scheme, _, ok := strings.Cut(ep, "://")
	if !ok {
		return "a database"
	}
	switch strings.ToLower(scheme) {
	case "mysql":
		return "MySQL"
	case "postgres", "postgresql":
		return "PostgreSQL"
	case "sqlite":
		return "SQLite"
	case "nats":
		return "NATS"
	}
	return "a " + scheme + " database"
}
