package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/command"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/undo"
)

// leakMarker is the secret every object of the leak test carries.
const leakMarker = "LEAKMARKER-q7Zx4Jw9Vt2Ks8"

// leakForms are the marker as an output could carry it: as is, and in
// base64 (as a Secret's data is printed, or a journal holds a value) at
// each of the three alignments (the groups a neighbour's bytes change are
// left out).
func leakForms() []string {
	forms := []string{leakMarker}
	for k := 0; k < 3; k++ {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), leakMarker...))
		forms = append(forms, enc[4:len(enc)-4])
	}
	return forms
}

// carriesMarker says whether b holds the marker in any of its forms.
func carriesMarker(b []byte) bool {
	for _, f := range leakForms() {
		if bytes.Contains(b, []byte(f)) {
			return true
		}
	}
	return false
}

// leakObjects stores the marker in every place a stored object can hold a
// secret: a Secret's data, a service-account token Secret's token, an
// annotation (kubectl's last-applied-configuration), a ConfigMap's data;
// each under the old key and identity-stored; a Secret under a key the
// configuration does not have (unreadable), a ConfigMap whose payload does
// not decode and an orphaned key (no resource owns it), each holding it too.
// It returns the keys of the objects that decode.
func leakObjects(c *testcluster.Cluster, oldCfg, lostCfg string) []string {
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), CreationTimestamp: metav1.Unix(1700000000, 0),
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"note":"` + leakMarker + `"}`}}
	}
	var keys []string
	for _, st := range []struct{ suffix, cfg string }{{"enc", oldCfg}, {"plain", ""}} {
		opaque := &api.Secret{ObjectMeta: meta("leak", "opaque-"+st.suffix), Type: api.SecretTypeOpaque,
			Data: map[string][]byte{"password": []byte("pw-" + leakMarker)}}
		token := &api.Secret{ObjectMeta: meta("leak", "token-"+st.suffix), Type: api.SecretTypeServiceAccountToken,
			Data: map[string][]byte{"token": []byte("eyJhbGciOiJSUzI1NiJ9." + leakMarker + ".sig"), "ca.crt": []byte("ca"), "namespace": []byte("leak")}}
		token.Annotations[api.ServiceAccountNameKey] = "default"
		cm := &api.ConfigMap{ObjectMeta: meta("leak", "config-"+st.suffix), Data: map[string]string{"app.properties": "password=" + leakMarker + "\n"}}
		sk := "/registry/secrets/leak/opaque-" + st.suffix
		c.Put(sk, testcluster.SecretsGR, opaque, "", "", st.cfg)
		tk := "/registry/secrets/leak/token-" + st.suffix
		c.Put(tk, testcluster.SecretsGR, token, "", "", st.cfg)
		ck := "/registry/configmaps/leak/config-" + st.suffix
		c.Put(ck, testcluster.ConfigMapsGR, cm, "", "", st.cfg)
		keys = append(keys, sk, tk, ck)
	}
	lost := &api.Secret{ObjectMeta: meta("leak", "lost"), Type: api.SecretTypeOpaque, Data: map[string][]byte{"password": []byte(leakMarker)}}
	c.Put("/registry/secrets/leak/lost", testcluster.SecretsGR, lost, "", "", lostCfg)
	c.PutRaw("/registry/configmaps/leak/corrupt", []byte("k8s\x00\n\x0f\n\x02v1\x12\tConfigMap\x12\xff\xff"+leakMarker))
	c.PutRaw("/registry/leakthings/leak/orphan", []byte(`{"password":"`+leakMarker+`"}`))
	return keys
}

// outputFormats are the -o values a command takes, as its --output flag's
// usage lists them ("" alone for a command without one).
func outputFormats(cmd command.CommandRef) []string {
	for _, f := range cmd.Flags {
		if f.Names[0] == "output" {
			return strings.Split(strings.TrimPrefix(f.Usage, "output format: "), "|")
		}
	}
	return []string{""}
}

// hasFlag says whether cmd takes --name.
func hasFlag(cmd command.CommandRef, name string) bool {
	for _, f := range cmd.Flags {
		if f.Names[0] == name {
			return true
		}
	}
	return false
}

// leakRun is one run of the tool in the leak test: what it printed, and
// whether its stdout may carry the marker (inspect --show-secrets).
type leakRun struct {
	args           []string
	stdout, stderr string
	code           int
	mayShow        bool
}

// TestNoSecretLeaves: the marker, stored in Secrets (data, a service-account
// token, an annotation) and ConfigMaps, encrypted and identity-stored, in an
// unreadable Secret, a ConfigMap that does not decode and an orphaned key,
// is run through every command of the tool in every output format its
// --output flag lists (read from the tool's own command list: a new command
// or format is run, or the test fails saying it does not know how), against
// etcd and against a snapshot file, writing runs, their rollbacks and
// quarantines included, each with its metrics file where it takes one. The
// marker appears in none of their stdout, stderr, metrics files, output
// snapshots' neighbours, nor in any file of the state directory (runs.log,
// run.json, plan.txt, summary.json, output.log) but the journals and
// snapshots, which hold stored values and are mode 0600 in directories of
// mode 0700; inspect --show-secrets alone prints it (which shows the check
// finds it).
func TestNoSecretLeaves(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	lostCfg := c.EncryptionConfig("lost.yaml", testcluster.AESCBC("key9", 9))
	keys := leakObjects(c, oldCfg, lostCfg)
	state := testcluster.StateDir(t)
	out := t.TempDir()
	ep := []string{"--endpoints", c.Srv.Endpoint}
	target := []string{"--target-version", "1.37"}
	write := []string{"--liveness-window", "1s"}

	var runs []*leakRun
	// run runs the tool; a usage error is the test's, unless the command
	// refuses a snapshot file by design (refusable).
	run := func(mayShow, refusable bool, args ...string) *leakRun {
		t.Helper()
		r := &leakRun{args: args, mayShow: mayShow}
		r.stdout, r.stderr, r.code = runTool(t, args...)
		switch {
		case r.code == 2 && refusable && strings.Contains(r.stderr, "error: --snapshot-file: "):
			t.Logf("%s reads no snapshot file", args[0])
		case r.code == 2 || r.code == 70:
			t.Errorf("kube-etcd-migrate %s: exit %d (the test's invocation, or a crash):\n%s", strings.Join(args, " "), r.code, r.stderr)
		}
		runs = append(runs, r)
		return r
	}
	tool := func(mayShow bool, args ...string) *leakRun {
		t.Helper()
		return run(mayShow, false, args...)
	}
	newest := func(command string) string {
		t.Helper()
		ents, err := os.ReadDir(filepath.Join(state, "runs"))
		if err != nil {
			t.Fatal(err)
		}
		id := ""
		for _, e := range ents {
			if strings.HasSuffix(e.Name(), "-"+command) && e.Name() > id {
				id = e.Name()
			}
		}
		if id == "" {
			t.Fatalf("no %s run in %s", command, state)
		}
		return id
	}
	// with adds -o FORMAT and, where the command takes them, a metrics
	// file of its own and an output snapshot of its own.
	with := func(cmd command.CommandRef, format, tag string, args ...string) []string {
		args = append([]string{cmd.Name}, args...)
		if format != "" {
			args = append(args, "-o", format)
		}
		if hasFlag(cmd, "metrics-file") {
			args = append(args, "--metrics-file", filepath.Join(out, fmt.Sprintf("%s-%s-%s.prom", cmd.Name, format, tag)))
		}
		return args
	}
	undoAll := func(id string) {
		t.Helper()
		tool(false, append(append([]string{"rollback", "--run", id, "--encryption-provider-config", newCfg}, write...), ep...)...)
	}

	// How to run each command against etcd, in one format.
	live := map[string]func(cmd command.CommandRef, f string){
		"inventory": func(cmd command.CommandRef, f string) {
			tool(false, with(cmd, f, "etcd", append([]string{"--encryption-provider-config", oldCfg}, ep...)...)...)
		},
		"inspect": func(cmd command.CommandRef, f string) {
			for _, k := range append(keys, "/registry/secrets/leak/lost", "/registry/configmaps/leak/corrupt", "/registry/leakthings/leak/orphan") {
				tool(false, with(cmd, f, "etcd", append([]string{k, "--encryption-provider-config", oldCfg}, ep...)...)...)
			}
			for _, k := range keys {
				r := tool(true, with(cmd, f, "etcd", append([]string{k, "--show-secrets", "--encryption-provider-config", oldCfg}, ep...)...)...)
				if !carriesMarker([]byte(r.stdout)) {
					t.Errorf("inspect %s --show-secrets -o %s does not show the marker:\n%s", k, f, r.stdout)
				}
			}
		},
		"verify": func(cmd command.CommandRef, f string) {
			tool(false, with(cmd, f, "etcd", append(append([]string{"--encryption-provider-config", newCfg}, target...), ep...)...)...)
			tool(false, with(cmd, f, "orphaned", append(append([]string{"--encryption-provider-config", newCfg, "--fail-on-orphaned", "--show-keys", "100"}, target...), ep...)...)...)
		},
		"plan": func(cmd command.CommandRef, f string) {
			tool(false, with(cmd, f, "etcd", append(append([]string{"--encryption-provider-config", newCfg}, target...), ep...)...)...)
		},
		"migrate": func(cmd command.CommandRef, f string) {
			tool(false, with(cmd, f, "dry", append(append([]string{"--dry-run", "--encryption-provider-config", newCfg}, target...), ep...)...)...)
			tool(false, with(cmd, f, "etcd", append(append(append([]string{"--encryption-provider-config", newCfg}, target...), write...), ep...)...)...)
			undoAll(newest("migrate"))
		},
		"rollback": func(cmd command.CommandRef, f string) {
			tool(false, append(append(append([]string{"migrate", "--encryption-provider-config", newCfg}, target...), write...), ep...)...)
			id := newest("migrate")
			tool(false, with(cmd, f, "dry", append([]string{"--run", id, "--dry-run", "--encryption-provider-config", newCfg}, ep...)...)...)
			tool(false, with(cmd, f, "etcd", append(append([]string{"--run", id, "--encryption-provider-config", newCfg}, write...), ep...)...)...)
		},
		"runs": func(cmd command.CommandRef, f string) {
			tool(false, with(cmd, f, "list", ep...)...)
			tool(false, with(cmd, f, "verify", append([]string{"--verify"}, ep...)...)...)
			tool(false, with(cmd, f, "show", append([]string{"--show", firstRun(t, state)}, ep...)...)...)
			tool(false, with(cmd, f, "prune", append([]string{"--prune", "--dry-run", "--keep", "1"}, ep...)...)...)
		},
		"quarantine": func(cmd command.CommandRef, f string) {
			unreadable := []string{"--reason", "undecryptable", "--resource", "secrets", "--reason", "corrupt-payload", "--resource", "configmaps", "--encryption-provider-config", oldCfg}
			tool(false, with(cmd, f, "dry", append(append([]string{"--dry-run"}, unreadable...), ep...)...)...)
			tool(false, with(cmd, f, "etcd", append(append(unreadable, write...), ep...)...)...)
			undoAll(newest("quarantine"))
			tool(false, with(cmd, f, "orphaned", append(append([]string{"--reason", "orphaned", "--encryption-provider-config", oldCfg}, write...), ep...)...)...)
			undoAll(newest("quarantine"))
		},
		"restore": func(cmd command.CommandRef, f string) {
			// A backup of the leak objects; the live etcd then lacks one of
			// them, which the run creates (its value in the journal only).
			backup := filepath.Join(t.TempDir(), "backup.db")
			if err := etcdscan.Snapshot(context.Background(), c.Cli, backup); err != nil {
				t.Fatal(err)
			}
			gone := "/registry/secrets/leak/opaque-enc"
			if _, err := c.Cli.Delete(context.Background(), gone); err != nil {
				t.Fatal(err)
			}
			sel := []string{"--snapshot-file", backup, "--key-prefix", "/registry/secrets/leak/", "--key-prefix", "/registry/configmaps/leak/",
				"--name", "opaque-enc", "--name", "token-enc", "--name", "config-plain",
				"--encryption-provider-config", newCfg, "--backup-encryption-provider-config", newCfg}
			sel = append(sel, target...)
			tool(false, with(cmd, f, "dry", append(append([]string{"--dry-run"}, sel...), ep...)...)...)
			tool(false, with(cmd, f, "etcd", append(append(sel, write...), ep...)...)...)
			// The online path writes the Secrets into its files, by design
			// (mode 0600, outside the directories checked): never on stdout
			// or stderr.
			tool(false, with(cmd, f, "manifests", append(append([]string{"--to-manifests", filepath.Join(t.TempDir(), "manifests")}, sel...), ep...)...)...)
			if v, _, _ := c.Get(gone); v == nil {
				t.Errorf("restore -o %s did not put %s back", f, gone)
			}
		},
		"version": func(cmd command.CommandRef, f string) {
			tool(false, with(cmd, f, "")...)
		},
		"completion": func(cmd command.CommandRef, f string) {
			for _, shell := range strings.Split(cmd.ArgsUsage, "|") {
				tool(false, cmd.Name, shell)
			}
		},
	}
	ref := command.NewReference()
	for _, cmd := range ref.Commands {
		runIn, ok := live[cmd.Name]
		if !ok {
			t.Errorf("command %s: the leak test does not know how to run it: add it to TestNoSecretLeaves", cmd.Name)
			continue
		}
		for _, f := range outputFormats(cmd) {
			runIn(cmd, f)
		}
	}

	// Against a snapshot file (the first run's, which holds every
	// object), each command that reads one, in every format; one that
	// writes writes an output snapshot.
	snap := filepath.Join(state, "runs", firstRun(t, state), undo.SnapshotFile)
	for _, cmd := range ref.Commands {
		if !hasFlag(cmd, "snapshot-file") {
			continue
		}
		for _, f := range outputFormats(cmd) {
			args := []string{"--snapshot-file", snap, "--encryption-provider-config", newCfg}
			if hasFlag(cmd, "target-version") {
				args = append(args, target...)
			}
			if hasFlag(cmd, "output-snapshot") {
				args = append(args, "--output-snapshot", filepath.Join(out, fmt.Sprintf("%s-%s.db", cmd.Name, f)))
			}
			switch cmd.Name {
			case "inspect":
				for _, k := range keys {
					tool(false, with(cmd, f, "snapshot", append([]string{k}, args...)...)...)
				}
			case "quarantine":
				tool(false, with(cmd, f, "snapshot", append([]string{"--reason", "undecryptable", "--resource", "secrets"}, args...)...)...)
			case "restore":
				tool(false, with(cmd, f, "snapshot", append(append([]string{"--key-prefix", "/registry/secrets/leak/", "--name", "opaque-plain", "--dry-run"}, args...), ep...)...)...)
			default:
				run(false, true, with(cmd, f, "snapshot", args...)...)
			}
		}
	}

	// What the tool printed.
	for _, r := range runs {
		if !r.mayShow && carriesMarker([]byte(r.stdout)) {
			t.Errorf("kube-etcd-migrate %s: stdout carries the marker:\n%s", strings.Join(r.args, " "), r.stdout)
		}
		if carriesMarker([]byte(r.stderr)) {
			t.Errorf("kube-etcd-migrate %s: stderr carries the marker:\n%s", strings.Join(r.args, " "), r.stderr)
		}
	}
	// What it left on disk: the journals and snapshots hold stored values
	// (the marker among them), private; nothing else holds it.
	held := 0
	for _, dir := range []string{state, out} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			if d.IsDir() {
				if dir == state && info.Mode().Perm() != 0o700 {
					t.Errorf("%s: mode %v, want 0700 (it holds stored values)", path, info.Mode().Perm())
				}
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if storedValues(path) {
				if info.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v, want 0600 (it holds stored values)", path, info.Mode().Perm())
				}
				if carriesMarker(b) {
					held++
				}
				return nil
			}
			if carriesMarker(b) {
				t.Errorf("%s carries the marker", path)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if held == 0 {
		t.Errorf("no journal or snapshot holds the marker: the test's check does not see it")
	}
	// Every file kind the issue names was looked at.
	seen := map[string]bool{}
	_ = filepath.WalkDir(state, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			seen[d.Name()] = true
		}
		return nil
	})
	for _, f := range []string{"runs.log", undo.RecordFile, undo.PlanFile, undo.SummaryFile, undo.OutputFile, undo.JournalFile, undo.SnapshotFile} {
		if !seen[f] {
			t.Errorf("no %s in the state directory: the runs did not leave what the test checks", f)
		}
	}
	proms, _ := filepath.Glob(filepath.Join(out, "*.prom"))
	if len(proms) == 0 {
		t.Errorf("no metrics file written")
	}
	sort.Strings(proms)
	t.Logf("%d runs of the tool; %d metrics file(s); %d journal(s) and snapshot(s) hold the marker", len(runs), len(proms), held)
}

// storedValues says whether the file at path holds stored values: a journal,
// a snapshot (a run's, or an output snapshot).
func storedValues(path string) bool {
	base := filepath.Base(path)
	return base == undo.JournalFile || base == undo.SnapshotFile || strings.HasSuffix(base, ".db")
}

// firstRun is the ID of the oldest run of the state directory.
func firstRun(t *testing.T, state string) string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(state, "runs"))
	if err != nil || len(ents) == 0 {
		t.Fatalf("no run in %s: %v", state, err)
	}
	return ents[0].Name()
}
