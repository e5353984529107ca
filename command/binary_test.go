package command

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/undo"
)

// stampedVersion is what the test binary is stamped with, as `make release` does.
const stampedVersion = "v9.9.9"

// buildStamped builds the binary with its version set through -ldflags.
func buildStamped(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kube-etcd-migrate")
	build := exec.Command("go", "build", "-ldflags", "-X kube-etcd-migrate/internal/buildinfo.version="+stampedVersion, "-o", bin, "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// execBin runs the binary with a clean etcdctl environment; it returns the exit
// code, stdout and stderr.
func execBin(t *testing.T, bin string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	// A writing run keeps its undo in a state directory of the test's own,
	// never in the machine's /var/lib/kube-etcd-migrate (--state-dir wins).
	cmd.Env = append(os.Environ(), "ETCDCTL_ENDPOINTS=", "ETCDCTL_CACERT=", "ETCDCTL_CERT=", "ETCDCTL_KEY=", "ETCDCTL_USER=", "ETCDCTL_PASSWORD=",
		undo.EnvStateDir+"="+filepath.Join(t.TempDir(), "state"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exitErr):
		return exitErr.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("%v: %v", args, err)
	return -1, "", ""
}

// goModVersion is the version go.mod resolves module to.
func goModVersion(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}", module).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", module, err)
	}
	return strings.TrimSpace(string(out))
}

type buildJSON struct {
	Build struct {
		Version    string `json:"version"`
		Kubernetes string `json:"kubernetes"`
	} `json:"build"`
}

// TestBinaryFlagsAnywhereAndVersions runs the built binary as an operator with
// etcdctl and kubectl habits would: flags after the key, before the command,
// after a "--"; the version it reports; the build in every JSON report and
// metrics file; shell completion.
func TestBinaryFlagsAnywhereAndVersions(t *testing.T) {
	bin := buildStamped(t)
	kubernetes := goModVersion(t, "k8s.io/kubernetes")

	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	om := metav1.ObjectMeta{Name: "db", Namespace: "default", UID: types.UID("uid-db"), CreationTimestamp: metav1.Unix(1700000000, 0)}
	put(t, cli, "/registry/secrets/default/db", schema.GroupResource{Resource: "secrets"}, &api.Secret{ObjectMeta: om, Type: api.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("s3cr3t-value")}})
	// A ConfigMap stored as JSON: stale (media type) for a protobuf target.
	if _, err := cli.Put(context.Background(), "/registry/configmaps/default/app",
		`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"app","namespace":"default","uid":"uid-app","creationTimestamp":"2023-11-14T22:13:20Z"},"data":{"k":"v"}}`); err != nil {
		t.Fatal(err)
	}
	ep := srv.Endpoint

	t.Run("flags after the key", func(t *testing.T) {
		for _, args := range [][]string{
			{"inspect", "/registry/secrets/default/db", "-o", "json", "--endpoints", ep},
			{"inspect", "/registry/secrets/default/db", "--output=json", "--endpoints=" + ep},
			{"--endpoints", ep, "inspect", "/registry/secrets/default/db", "-o", "json"},
			{"inspect", "-o", "json", "--endpoints", ep, "--", "/registry/secrets/default/db"},
			{"inspect", "--endpoints", ep, "/registry/secrets/default/db", "--show-secrets=false", "-o", "json"},
		} {
			code, stdout, stderr := execBin(t, bin, args...)
			var got struct {
				Storage struct {
					Key string `json:"key"`
				} `json:"storage"`
				Object struct {
					Data map[string]string `json:"data"`
				} `json:"object"`
			}
			if code != 0 || stderr != "" {
				t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
				continue
			}
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Errorf("%v: -o json after the key was not applied: %v\n%s", args, err, stdout)
				continue
			}
			if got.Storage.Key != "/registry/secrets/default/db" || got.Object.Data["password"] != "<redacted 12 bytes>" {
				t.Errorf("%v: %s", args, stdout)
			}
		}
		// A bool flag after the key.
		code, stdout, stderr := execBin(t, bin, "inspect", "/registry/secrets/default/db", "--endpoints", ep, "--show-secrets")
		if code != 0 || !strings.Contains(stdout, "password: czNjcjN0LXZhbHVl") {
			t.Errorf("--show-secrets after the key: exit %d\n%s%s", code, stdout, stderr)
		}
		// "--" ends the flags: what follows is the key, even if it looks like a flag.
		code, _, stderr = execBin(t, bin, "inspect", "--endpoints", ep, "--", "--show-secrets")
		if code != exitError || stderr != "error: key not found: --show-secrets\n" {
			t.Errorf("inspect -- --show-secrets: exit %d, stderr %q", code, stderr)
		}
		// Flags after the key are still validated: a usage error, exit 2.
		code, _, stderr = execBin(t, bin, "inspect", "/registry/secrets/default/db", "--endpoints", ep, "-o", "xml")
		if code != exitUsage || !strings.Contains(stderr, `"xml"`) {
			t.Errorf("-o xml after the key: exit %d, stderr %q", code, stderr)
		}
	})

	t.Run("version", func(t *testing.T) {
		code, stdout, stderr := execBin(t, bin, "--version")
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "kube-etcd-migrate "+stampedVersion+"\n") || !strings.Contains(stdout, "kubernetes:      "+kubernetes+" ") {
			t.Errorf("--version: exit %d\n%s%s", code, stdout, stderr)
		}
		code, text, _ := execBin(t, bin, "version")
		if code != 0 || text != stdout {
			t.Errorf("version and --version differ:\n%s\n%s", text, stdout)
		}
		code, stdout, stderr = execBin(t, bin, "version", "-o", "json")
		var v struct {
			Version, Kubernetes, Etcd, EtcdClient, Go, KubeAPIServer, DefaultTargetVersion string
			TargetVersions                                                                 []string
		}
		if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil {
			t.Fatalf("version -o json: exit %d\n%s%s", code, stdout, stderr)
		}
		goVersion, _ := exec.Command("go", "env", "GOVERSION").Output()
		if v.Version != stampedVersion || v.Kubernetes != kubernetes || v.Etcd != goModVersion(t, "go.etcd.io/etcd/server/v3") ||
			"v"+v.EtcdClient != goModVersion(t, "go.etcd.io/etcd/client/v3") || v.Go != strings.TrimSpace(string(goVersion)) {
			t.Errorf("version -o json: %+v", v)
		}
		// The Kubernetes module and the kube-apiserver it reproduces agree.
		if !strings.HasPrefix(v.Kubernetes, "v"+v.KubeAPIServer+".") || v.DefaultTargetVersion != v.KubeAPIServer {
			t.Errorf("kubernetes %s, kube-apiserver %s, default target %s", v.Kubernetes, v.KubeAPIServer, v.DefaultTargetVersion)
		}
		// Every target version listed is accepted by --target-version, the one below
		// the oldest is refused, and the list ends with the binary's own version.
		if len(v.TargetVersions) < 2 || v.TargetVersions[len(v.TargetVersions)-1] != v.KubeAPIServer {
			t.Fatalf("target versions %v", v.TargetVersions)
		}
		for _, tv := range v.TargetVersions {
			if _, err := release.Named(tv); err != nil {
				t.Errorf("listed target %s refused: %v", tv, err)
			}
		}
		var major, minor int
		if _, err := fmt.Sscanf(v.TargetVersions[0], "%d.%d", &major, &minor); err != nil {
			t.Fatal(err)
		}
		below := fmt.Sprintf("%d.%d", major, minor-1)
		code, _, stderr = execBin(t, bin, "verify", "--endpoints", ep, "--target-version", below)
		if code != exitUsage || !strings.Contains(stderr, below) {
			t.Errorf("--target-version %s below the listed range: exit %d, stderr %q", below, code, stderr)
		}
	})

	t.Run("build in every JSON report and metrics file", func(t *testing.T) {
		dir := t.TempDir()
		journal := filepath.Join(dir, "journal")
		verifyProm, migrateProm := filepath.Join(dir, "verify.prom"), filepath.Join(dir, "migrate.prom")
		for _, run := range []struct {
			args []string
			code int
		}{
			{[]string{"inventory", "-o", "json", "--endpoints", ep}, 0},
			{[]string{"verify", "-o", "json", "--endpoints", ep, "--metrics-file", verifyProm}, exitStale},
			{[]string{"verify", "-o", "yaml", "--endpoints", ep}, exitStale},
			{[]string{"migrate", "--endpoints", ep, "-o", "json", "--liveness-window", "500ms", "--journal", journal, "--metrics-file", migrateProm, "--target-version", "1.37"}, 0},
			{[]string{"rollback", "-o", "json", "--journal", journal, "--endpoints", ep}, 0},
		} {
			code, stdout, stderr := execBin(t, bin, run.args...)
			if code != run.code {
				t.Errorf("%v: exit %d, want %d\n%s", run.args, code, run.code, stderr)
				continue
			}
			if run.args[2] == "yaml" {
				if !strings.HasPrefix(stdout, "build:\n") || !strings.Contains(stdout, "  kubernetes: "+kubernetes+"\n") || !strings.Contains(stdout, "  version: "+stampedVersion+"\n") {
					t.Errorf("%v: no build in the YAML report:\n%s", run.args, stdout)
				}
				continue
			}
			var b buildJSON
			if err := json.Unmarshal([]byte(stdout), &b); err != nil || b.Build.Version != stampedVersion || b.Build.Kubernetes != kubernetes {
				t.Errorf("%v: build %+v (%v) in\n%s", run.args, b.Build, err, stdout)
			}
			// The report's own members are all still there.
			var members map[string]json.RawMessage
			_ = json.Unmarshal([]byte(stdout), &members)
			want := map[string]string{"inventory": "resources", "verify": "summary", "migrate": "summary", "rollback": "restored"}[run.args[0]]
			if _, ok := members[want]; !ok {
				t.Errorf("%v: report lost %q:\n%s", run.args, want, stdout)
			}
		}
		for _, prom := range []string{verifyProm, migrateProm} {
			data, err := os.ReadFile(prom)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(data), `kube_etcd_migrate_build_info{`) ||
				!strings.Contains(string(data), `kubernetes="`+kubernetes+`"`) || !strings.Contains(string(data), `version="`+stampedVersion+`"`) {
				t.Errorf("%s has no build info:\n%s", prom, data)
			}
		}
	})

	t.Run("completion", func(t *testing.T) {
		// What the completion scripts ask the binary: commands, then flags.
		code, stdout, _ := execBin(t, bin, "--generate-bash-completion")
		for _, c := range []string{"inventory", "inspect", "verify", "migrate", "rollback", "version", "completion"} {
			if code != 0 || !slices.Contains(strings.Fields(stdout), c) {
				t.Errorf("command completion lacks %s: %q", c, stdout)
			}
		}
		code, stdout, _ = execBin(t, bin, "verify", "--encryption-p", "--generate-bash-completion")
		if code != 0 || strings.TrimSpace(stdout) != "--encryption-provider-config" {
			t.Errorf("flag completion: exit %d %q", code, stdout)
		}
		code, stdout, _ = execBin(t, bin, "inspect", "/registry/x", "--show", "--generate-bash-completion")
		if code != 0 || strings.TrimSpace(stdout) != "--show-secrets" {
			t.Errorf("flag completion after the key: exit %d %q", code, stdout)
		}
		// The bash script registers the completion for the binary's name.
		code, script, _ := execBin(t, bin, "completion", "bash")
		if code != 0 {
			t.Fatalf("completion bash: exit %d", code)
		}
		out, err := exec.Command("bash", "-c", script+"\ncomplete -p kube-etcd-migrate").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "complete -o bashdefault -o default -o nospace -F _cli_bash_autocomplete kube-etcd-migrate" {
			t.Errorf("bash did not register the completion: %v\n%s", err, out)
		}
		code, script, _ = execBin(t, bin, "completion", "zsh")
		if code != 0 || !strings.HasPrefix(script, "#compdef kube-etcd-migrate\n") || !strings.Contains(script, "compdef _cli_zsh_autocomplete kube-etcd-migrate\n") {
			t.Errorf("completion zsh: exit %d\n%s", code, script)
		}
		if code, _, stderr := execBin(t, bin, "completion", "fish"); code != exitUsage || !strings.Contains(stderr, "fish") {
			t.Errorf("completion fish: exit %d %q", code, stderr)
		}

		// The whole loop as bash runs it on TAB: the script's function, the binary on
		// PATH, bash-completion's word splitting.
		t.Run("bash end to end", func(t *testing.T) {
			const bashCompletion = "/usr/share/bash-completion/bash_completion"
			if _, err := os.Stat(bashCompletion); err != nil {
				if os.Getenv("CI") != "" {
					t.Fatalf("%s not installed (Debian: bash-completion; .ci/run installs it)", bashCompletion)
				}
				t.Skipf("%s not installed (Debian: bash-completion)", bashCompletion)
			}
			script := `source ` + bashCompletion + `
source <(kube-etcd-migrate completion bash)
tab() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=(); _cli_bash_autocomplete; echo "${COMPREPLY[*]}"; }
tab kube-etcd-migrate ver
tab kube-etcd-migrate verify --encryption-p
tab kube-etcd-migrate inspect /registry/x --show
tab kube-etcd-migrate completion ""
`
			cmd := exec.Command("bash", "-c", script)
			cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
			out, err := cmd.CombinedOutput()
			want := "verify version\n--encryption-provider-config\n--show-secrets\nbash zsh\n"
			if err != nil || string(out) != want {
				t.Errorf("bash completion: %v\n got %q\nwant %q", err, out, want)
			}
		})
	})
}
