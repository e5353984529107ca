package apiserverconfig

import (
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/mattn/go-shellwords"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"

	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
)

// manifestCodecs decode a static pod as the kubelet does (any version of the
// core scheme, YAML or JSON).
var manifestCodecs = serializer.NewCodecFactory(legacyscheme.Scheme)

func readManifest(file, container, root string) ([]string, *hostMounts, string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, "", input.Errorf("%s: %w", input.APIServerManifest, err)
	}
	obj, _, err := manifestCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, nil, "", input.Errorf("%s %s: not a Pod manifest: %s", input.APIServerManifest, file, textfmt.OneLine(err.Error()))
	}
	pod := &corev1.Pod{}
	if err := legacyscheme.Scheme.Convert(obj, pod, nil); err != nil {
		return nil, nil, "", input.Errorf("%s %s: not a Pod manifest (%s)", input.APIServerManifest, file, obj.GetObjectKind().GroupVersionKind().Kind)
	}
	c, err := pickContainer(pod, container)
	if err != nil {
		return nil, nil, "", input.Errorf("%s %s: %w", input.APIServerManifest, file, err)
	}
	// The kubelet expands $(VAR) in command and args from the container's env.
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			env[e.Name] = expansion.Expand(e.Value, expansion.MappingFuncFor(env))
		}
	}
	mapping := expansion.MappingFuncFor(env)
	var line []string
	for _, a := range append(append([]string(nil), c.Command...), c.Args...) {
		line = append(line, expansion.Expand(a, mapping))
	}
	args := dropProgram(line)
	mounts, err := newHostMounts(pod, c, root)
	if err != nil {
		return nil, nil, "", input.Errorf("%s %s: %w", input.APIServerManifest, file, err)
	}
	return args, mounts, c.Image, nil
}

func pickContainer(pod *corev1.Pod, name string) (*corev1.Container, error) {
	var names []string
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		names = append(names, c.Name)
		if name != "" && c.Name == name {
			return c, nil
		}
	}
	if name == "" {
		if len(pod.Spec.Containers) == 1 {
			return &pod.Spec.Containers[0], nil
		}
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == "kube-apiserver" {
				return &pod.Spec.Containers[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no container named %q (containers: %s)", orDefault(name, "kube-apiserver"), strings.Join(names, ", "))
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// dropProgram drops the program (and anything before the first flag), e.g.
// "kube-apiserver" or "/usr/local/bin/kube-apiserver"; a program run
// through a wrapper with flags of its own (kops runs "/go-runner
// --log-file=/var/log/kube-apiserver.log --also-stdout
// /usr/local/bin/kube-apiserver --etcd-servers=..."), from the word naming
// kube-apiserver on.
func dropProgram(words []string) []string {
	if len(words) > 0 && !strings.HasPrefix(words[0], "-") && path.Base(words[0]) != "kube-apiserver" {
		for i, w := range words[1:] {
			if path.Base(w) == "kube-apiserver" {
				words = words[i+2:]
				break
			}
		}
	}
	for i, w := range words {
		if strings.HasPrefix(w, "-") {
			return words[i:]
		}
	}
	return nil
}

func readFlagsFile(file string) ([]string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, input.Errorf("%s: %w", input.APIServerFlagsFile, err)
	}
	var words []string
	var cont strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, " \t\r")
		trimmed := strings.TrimSpace(line)
		if cont.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#") || strings.HasPrefix(trimmed, ";")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cont.WriteString(strings.TrimSuffix(line, "\\"))
			cont.WriteString(" ")
			continue
		}
		cont.WriteString(line)
		full := strings.TrimSpace(cont.String())
		cont.Reset()
		// A systemd unit: only ExecStart holds the command line.
		if k, v, ok := strings.Cut(full, "="); ok && isUnitKey(k) {
			if k != "ExecStart" {
				continue
			}
			full = v
		}
		if strings.HasPrefix(full, "[") {
			continue
		}
		w, err := shellwords.Parse(full)
		if err != nil {
			return nil, input.Errorf("%s %s: %w", input.APIServerFlagsFile, file, err)
		}
		words = append(words, w...)
	}
	for _, w := range words {
		if strings.Contains(w, "${") || (strings.HasPrefix(w, "$") && len(w) > 1) {
			return nil, input.Errorf("%s %s: %q refers to an environment variable; write its value instead", input.APIServerFlagsFile, file, w)
		}
	}
	return dropProgram(words), nil
}

func isUnitKey(k string) bool {
	if k == "" || strings.ContainsAny(k, " -") {
		return false
	}
	return k[0] >= 'A' && k[0] <= 'Z'
}

var _ runtime.Decoder = manifestCodecs.UniversalDeserializer()
