package installer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/mattn/go-shellwords"
)

// systemdUnitDirs are the directories systemd loads system units from
// (systemd.unit(5), "Unit File Load Path"), the first one holding a unit
// winning: the administrator's, the runtime's, then the packages'. k3s's
// install script writes /etc/systemd/system/k3s.service; RKE2's tarball puts
// rke2-server.service in /usr/local/lib/systemd/system (in
// /etc/systemd/system with another INSTALL_RKE2_TAR_PREFIX), its RPM in
// /usr/lib/systemd/system.
var systemdUnitDirs = []string{"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system"}

// systemdUnit is what a systemd unit, its drop-ins and its environment
// files say of the command it runs, as systemd reads them.
type systemdUnit struct {
	name string // "k3s.service"
	// file is the unit file read and dropins its drop-ins, in the order
	// applied (paths under the root).
	file     string
	dropins  []string
	execArgs []string // ExecStart's words
	// envFiles are EnvironmentFile= paths of the node, specifiers expanded
	// (a leading "-", optional, dropped).
	envFiles []string
	// env is the unit's environment: Environment=, then the environment
	// files, which override it (systemd.exec(5)).
	env map[string]string
	// envFrom names the file each variable of env was read from.
	envFrom map[string]string
}

// files are the unit's files read: the unit, its drop-ins, then the
// environment files that exist.
func (u systemdUnit) files(root string) []string {
	out := append([]string{u.file}, u.dropins...)
	seen := map[string]bool{}
	for _, f := range u.envFiles {
		p := under(root, f)
		if !seen[p] {
			if ok, _ := exists(p); ok {
				out = append(out, p)
			}
			seen[p] = true
		}
	}
	return out
}

// readSystemdUnit reads the system unit name ("k3s.service") under root as
// systemd loads it: the unit file from the first directory of its load path
// holding it, then its drop-ins (NAME.d/*.conf of every directory of the
// load path, a file name in an earlier directory hiding the same name in a
// later one, applied in file-name order), then its EnvironmentFile= files.
// ok is false when there is no such unit.
func readSystemdUnit(root, name string) (u systemdUnit, ok bool, err error) {
	u = systemdUnit{name: name, env: map[string]string{}, envFrom: map[string]string{}}
	for _, dir := range systemdUnitDirs {
		p := under(root, filepath.Join(dir, name))
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() {
			u.file = p
			break
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return u, false, err
		}
	}
	if u.file == "" {
		return u, false, nil
	}
	dropins := map[string]string{}
	for _, dir := range systemdUnitDirs {
		d := under(root, filepath.Join(dir, name+".d"))
		entries, err := os.ReadDir(d)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				continue
			}
			return u, true, err
		}
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".conf") {
				continue
			}
			if _, hidden := dropins[e.Name()]; !hidden {
				dropins[e.Name()] = filepath.Join(d, e.Name())
			}
		}
	}
	names := make([]string, 0, len(dropins))
	for n := range dropins {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		u.dropins = append(u.dropins, dropins[n])
	}
	environment := map[string]string{}
	for _, f := range append([]string{u.file}, u.dropins...) {
		data, err := os.ReadFile(f)
		if err != nil {
			return u, true, err
		}
		if err := u.parse(f, data, environment); err != nil {
			return u, true, err
		}
	}
	for k, v := range environment {
		u.env[k], u.envFrom[k] = v, u.file
	}
	for _, f := range u.envFiles {
		p := under(root, f)
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if err != nil {
			return u, true, err
		}
		for k, v := range parseEnvironmentFile(data) {
			u.env[k], u.envFrom[k] = v, p
		}
	}
	return u, true, nil
}

// parse applies one unit file or drop-in (file, read as data) to u: the
// [Service] section's ExecStart=, EnvironmentFile= and Environment= (into
// environment). An empty assignment resets the list, as systemd does.
func (u *systemdUnit) parse(file string, data []byte, environment map[string]string) error {
	section := ""
	var line strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), " \t\r")
		if line.Len() == 0 {
			t := strings.TrimSpace(l)
			if strings.HasPrefix(t, "#") || strings.HasPrefix(t, ";") {
				continue
			}
			if strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]") {
				section = strings.TrimSpace(t[1 : len(t)-1])
				continue
			}
		}
		if strings.HasSuffix(l, "\\") {
			line.WriteString(strings.TrimSuffix(l, "\\") + " ")
			continue
		}
		line.WriteString(l)
		full := strings.TrimSpace(line.String())
		line.Reset()
		if section != "" && section != "Service" {
			continue
		}
		key, val, found := strings.Cut(full, "=")
		if !found {
			continue
		}
		val = strings.TrimSpace(val)
		switch strings.TrimSpace(key) {
		case "ExecStart":
			if val == "" {
				u.execArgs = nil
				continue
			}
			words, err := shellwords.Parse(u.specifiers(strings.TrimLeft(val, "-@+!:")))
			if err != nil {
				return fmt.Errorf("%s: ExecStart: %w", file, err)
			}
			u.execArgs = words
		case "EnvironmentFile":
			if val == "" {
				u.envFiles = nil
				continue
			}
			u.envFiles = append(u.envFiles, u.specifiers(strings.TrimPrefix(val, "-")))
		case "Environment":
			if val == "" {
				clear(environment)
				continue
			}
			words, err := shellwords.Parse(val)
			if err != nil {
				return fmt.Errorf("%s: Environment: %w", file, err)
			}
			for _, w := range words {
				if k, v, ok := strings.Cut(w, "="); ok {
					environment[k] = u.specifiers(v)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// specifiers expands the unit specifiers of s that name the unit
// (systemd.unit(5), "Specifiers"): %n the full unit name, %N the name
// without its type suffix, %p the prefix (before "@"), %i the instance,
// %% a "%". Others are left as written.
func (u *systemdUnit) specifiers(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	full := u.name
	noSuffix := strings.TrimSuffix(full, filepath.Ext(full))
	prefix, instance, _ := strings.Cut(noSuffix, "@")
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteString(full)
		case 'N':
			b.WriteString(noSuffix)
		case 'p':
			b.WriteString(prefix)
		case 'i':
			b.WriteString(instance)
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// parseEnvironmentFile reads an EnvironmentFile= file: KEY=VALUE lines,
// "#" and ";" comments, a value in double or single quotes unquoted.
func parseEnvironmentFile(data []byte) map[string]string {
	env := map[string]string{}
	for _, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";") {
			continue
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(l, "export "), "=")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if uq, err := strconv.Unquote(v); err == nil && strings.HasPrefix(v, `"`) {
			v = uq
		} else if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = v[1 : len(v)-1]
		}
		env[strings.TrimSpace(k)] = v
	}
	return env
}

// subcommandArgs are the words after the subcommand sub ("server") of the
// unit's ExecStart; ok is false when the unit does not run it.
func (u systemdUnit) subcommandArgs(sub string) ([]string, bool) {
	for i, w := range u.execArgs {
		if w == sub {
			return u.execArgs[i+1:], true
		}
		if strings.HasPrefix(w, "-") {
			break
		}
	}
	return nil, false
}
