package command

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/updatepath"
	"kube-etcd-migrate/writerun"
)

// Configuration precedence: a flag on the command line, then kube-apiserver's
// own configuration (--apiserver-manifest, --apiserver-flags-file), then the
// flag's environment variable (the ETCDCTL_* of etcdctl's flags, KEM_PREFIX),
// then the default. urfave/cli applies an environment variable as if the flag
// were set, so which of the two it was is read from the command line itself.

// environmentHelpTx is the ENVIRONMENT section of --help: every variable the
// tool reads.
var environmentHelpTx = `ENVIRONMENT:
   ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER,
   ETCDCTL_PASSWORD, ETCDCTL_DIAL_TIMEOUT, ETCDCTL_COMMAND_TIMEOUT
                      etcdctl's: the value of the flag of the same name
   KEM_PREFIX         the value of --prefix
      Precedence: the flag on the command line, then kube-apiserver's own
      configuration (--apiserver-manifest, --apiserver-flags-file, or the one
      found on the node: --distribution), then the environment, then the
      default. A value taken from the environment, or one set there that
      kube-apiserver's configuration overrode, is named on one line of stderr
      (a password never shown). $ETCDCTL_ENDPOINTS names the cluster when no
      installer's control plane is found on the node.
   KUBE_ETCD_MIGRATE_LOCK_TTL
                      seconds: the time to live of the cluster's lock in etcd
                      (default ` + fmt.Sprint(int(writerun.DefaultLockTTL.Seconds())) + `): a holder killed without releasing it frees
                      it this long after its last keep-alive
   GOMEMLIMIT, GOGC   Go's runtime (defaults here: ` + fmt.Sprintf("%d MiB (migrate %d MiB, %d on SQLite)", defaultMemoryLimit>>20, migrateMemoryLimit>>20, sqliteMigrateMemoryLimit>>20) + ` and ` + fmt.Sprint(defaultGCPercent) + `)
   TMPDIR             where a --snapshot-file is restored (commands that write)
   ` + updatepath.CheckShortcutEnv + `
                      test hook: check the field manager shortcut on every object`

// onCommandLine reports whether the flag name (or an alias of it) was given on
// the command line, not taken from its environment variable.
func onCommandLine(c *cli.Context, name string) bool {
	args, ok := c.App.Metadata[argsMetadata].([]string)
	if !ok {
		return c.IsSet(name)
	}
	f := lookupFlag(c, name)
	if f == nil {
		return false
	}
	names := map[string]bool{}
	for _, n := range f.Names() {
		names[n] = true
	}
	takes := flagIndex(append(append([]cli.Flag(nil), c.App.Flags...), commandFlags(c)...))
	for i := 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if !isFlagWord(a) {
			continue
		}
		n, inline := flagName(a)
		if names[n] {
			return true
		}
		if takes[n] && !inline {
			i++
		}
	}
	return false
}

// argsMetadata is the key of the command line (as parsed) in App.Metadata.
const argsMetadata = "args"

// startedMetadata is the key of the time the command began in App.Metadata.
const startedMetadata = "started"

// processStart is when the binary's process started (Run sets it; zero in
// tests, which call run: the command then began when run did).
var processStart time.Time

// startOfProcess is when this process started, from /proc/self/stat's start
// time (clock ticks since boot) and /proc/uptime; zero where /proc cannot
// tell. plan counts it in its estimate: migrate's wall time includes the
// process's start and the runtime's and packages' initialisation.
func startOfProcess() time.Time {
	now := time.Now()
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return time.Time{}
	}
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Time{}
	}
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 {
		s = s[i+1:] // the fields after the command name
	}
	f, u := strings.Fields(s), strings.Fields(string(up))
	if len(f) < 20 || len(u) == 0 {
		return time.Time{}
	}
	ticks, err1 := strconv.ParseInt(f[19], 10, 64) // starttime, in USER_HZ (100) ticks
	uptime, err2 := strconv.ParseFloat(u[0], 64)
	if err1 != nil || err2 != nil {
		return time.Time{}
	}
	age := time.Duration(uptime*float64(time.Second)) - time.Duration(ticks)*time.Second/100
	if age < 0 || age > time.Minute {
		return time.Time{}
	}
	return now.Add(-age)
}

// startedAt is when the command began (zero when unknown).
func startedAt(c *cli.Context) time.Time {
	t, _ := c.App.Metadata[startedMetadata].(time.Time)
	return t
}

func commandFlags(c *cli.Context) []cli.Flag {
	if c.Command == nil {
		return nil
	}
	return c.Command.Flags
}

func lookupFlag(c *cli.Context, name string) cli.Flag {
	for _, f := range append(commandFlags(c), c.App.Flags...) {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// fromEnvironment names the environment variable the flag's value came from,
// or "" when it did not come from one (given on the command line, or none set).
func fromEnvironment(c *cli.Context, name string) string {
	if onCommandLine(c, name) {
		return ""
	}
	f, ok := lookupFlag(c, name).(cli.DocGenerationFlag)
	if !ok {
		return ""
	}
	for _, e := range f.GetEnvVars() {
		if v, set := os.LookupEnv(e); set && strings.TrimSpace(v) != "" {
			return e
		}
	}
	return ""
}

// origin is where a flag's value came from: the command line, else the
// environment variable named (else its default).
type origin struct {
	onLine bool
	env    string
}

// provenance is the origin of each flag the configuration precedence
// concerns (etcd's connection flags, --prefix, --encryption-provider-config,
// --storage-media-type), read from the command line once (newProvenance).
type provenance map[string]origin

// precedenceFlags are the flags whose origin provenance keeps.
var precedenceFlags = []string{"endpoints", "cacert", "cert", "key", "user", "password", "dial-timeout", "command-timeout", "prefix", "encryption-provider-config", "storage-media-type"}

func newProvenance(c *cli.Context) provenance {
	p := provenance{}
	for _, name := range precedenceFlags {
		p[name] = origin{onLine: onCommandLine(c, name), env: fromEnvironment(c, name)}
	}
	return p
}

// onCommandLine reports whether the flag was given on the command line.
func (p provenance) onCommandLine(name string) bool { return p[name].onLine }

// fromEnvironment names the environment variable the flag's value came from,
// or "" when it did not come from one.
func (p provenance) fromEnvironment(name string) string { return p[name].env }

// envReport collects what the environment gave, and what of it kube-apiserver's
// configuration overrode, for one line on stderr.
type envReport struct {
	use, ignore []string
}

// used notes a flag's value taken from its environment variable; value is
// what the tool uses (never printed for --password, a user name without its
// password for --user).
func (r *envReport) used(p provenance, flag, value string) {
	env := p.fromEnvironment(flag)
	if env == "" {
		return
	}
	switch flag {
	case "password":
		value = "(not shown)"
	case "user":
		value, _, _ = strings.Cut(value, ":")
	}
	r.use = append(r.use, fmt.Sprintf("--%s=%s ($%s)", flag, value, env))
}

// ignored notes a flag's environment variable that kube-apiserver's apiFlag
// overrode, when their values differ (envValue, apiValue).
func (r *envReport) ignored(p provenance, flag string, api *apiserverconfig.Config, apiFlag, envValue, apiValue string) {
	same := func(a, b string) bool {
		norm := func(s string) string { return strings.TrimRight(strings.ReplaceAll(s, " ", ""), "/") }
		return norm(a) == norm(b)
	}
	if env := p.fromEnvironment(flag); env != "" && !same(envValue, apiValue) {
		r.ignore = append(r.ignore, fmt.Sprintf("$%s (kube-apiserver's --%s from the %s wins)", env, apiFlag, api.From[apiFlag]))
	}
}

// print writes the line, when the environment gave or was denied anything.
func (r *envReport) print(w io.Writer) {
	var parts []string
	if len(r.use) > 0 {
		parts = append(parts, "using from the environment: "+strings.Join(r.use, " "))
	}
	if len(r.ignore) > 0 {
		parts = append(parts, "ignoring "+strings.Join(r.ignore, ", ")+" (flags > kube-apiserver's configuration > environment)")
	}
	if len(parts) > 0 {
		fmt.Fprintln(w, strings.Join(parts, "; "))
	}
}
