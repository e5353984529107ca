package installer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/internal/textfmt"
)

// settings are a k3s or RKE2 server's settings, merged as k3s's own
// configuration parser (pkg/configfilearg) merges them: the configuration
// file, then each file of its .d directory in name order (.yaml and .yml),
// a key replacing the value before it unless it ends in "+", which appends
// to a list; then the server's command line (a scalar flag given there
// wins, a list flag is appended to); then the environment, for a flag set
// nowhere else.
type settings struct {
	values map[string][]string
	// files are the files read, in order.
	files []string
}

func (s *settings) set(key string, vals []string, appendTo bool) {
	if s.values == nil {
		s.values = map[string][]string{}
	}
	if appendTo {
		s.values[key] = append(s.values[key], vals...)
		return
	}
	s.values[key] = vals
}

// scalar is a flag's value: the last one given ("" when none).
func (s *settings) scalar(keys ...string) string {
	for _, k := range keys {
		if v := s.values[k]; len(v) > 0 {
			return v[len(v)-1]
		}
	}
	return ""
}

// list is a list flag's values, in order.
func (s *settings) list(key string) []string { return s.values[key] }

// has reports whether the flag was given anywhere.
func (s *settings) has(keys ...string) bool {
	for _, k := range keys {
		if _, ok := s.values[k]; ok {
			return true
		}
	}
	return false
}

// flag is a boolean flag's value (false when not given or not a bool).
func (s *settings) flag(key string) bool {
	v := s.scalar(key)
	if v == "" && s.has(key) {
		return true
	}
	b, _ := strconv.ParseBool(v)
	return b
}

// readConfigFiles merges the configuration file (under root) and its .d
// directory into s, as k3s does: the file may be missing if the directory
// has files. It reports whether anything was read.
func (s *settings) readConfigFiles(root, file string) (bool, error) {
	var files []string
	if _, err := os.Stat(under(root, file)); err == nil {
		files = append(files, file)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	entries, err := os.ReadDir(under(root, file+".d"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	var dropins []string
	for _, e := range entries {
		name := strings.ToLower(e.Name())
		if e.IsDir() || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		dropins = append(dropins, filepath.Join(file+".d", e.Name()))
	}
	sort.Strings(dropins)
	files = append(files, dropins...)
	for _, f := range files {
		data, err := os.ReadFile(under(root, f))
		if err != nil {
			return false, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(data, &m); err != nil {
			return false, fmt.Errorf("%s: not a configuration file: %s", under(root, f), textfmt.OneLine(err.Error()))
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			name, appendTo := strings.CutSuffix(k, "+")
			s.set(name, toStrings(m[k]), appendTo)
		}
		s.files = append(s.files, under(root, f))
	}
	return len(files) > 0, nil
}

// toStrings is a configuration value as the flags it stands for: a list's
// items, or the one value.
func toStrings(v any) []string {
	switch t := v.(type) {
	case nil:
		return []string{""}
	case []any:
		out := make([]string, 0, len(t))
		for _, e := range t {
			out = append(out, toStrings(e)...)
		}
		return out
	case float64:
		return []string{strconv.FormatFloat(t, 'f', -1, 64)}
	default:
		return []string{fmt.Sprint(t)}
	}
}

// readCommandLine merges the server's own flags (the words after its
// "server" subcommand) into s: a flag given there is set anew, a list flag
// appended to. valueFlags are the flags that take a value without "=";
// short names are mapped by aliases.
func (s *settings) readCommandLine(words []string, valueFlags map[string]bool, lists map[string]bool, aliases map[string]string) {
	cli := map[string][]string{}
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			continue
		}
		name, v, hasValue := strings.Cut(strings.TrimLeft(w, "-"), "=")
		if a, ok := aliases[name]; ok {
			name = a
		}
		if !hasValue {
			if valueFlags[name] && i+1 < len(words) {
				v = words[i+1]
				i++
			} else {
				v = "true"
			}
		}
		cli[name] = append(cli[name], v)
	}
	for name, vals := range cli {
		s.set(name, vals, lists[name])
	}
}
