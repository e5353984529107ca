package command

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
)

// TestOverridesOnlyEventsStale: a kube-apiserver command line keeping Events
// in a second etcd (--etcd-servers-overrides), on two real etcds, where only
// the events are stale (stored as JSON) and the main etcd still has events
// of its own from before the override (kube-apiserver no longer reads them:
// left alone). migrate rewrites the second etcd's events only, its report
// per etcd; `rollback --run` puts them back byte for byte although the main
// etcd's journal is empty (nothing written there). --endpoints replaces the
// main etcd only, and says so; a command that reads one etcd refuses.
func TestOverridesOnlyEventsStale(t *testing.T) {
	main := testcluster.New(t, testetcd.Options{})
	events := testcluster.New(t, testetcd.Options{})
	cfg := main.EncryptionConfig("enc.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	main.Put("/registry/secrets/ns/s", testcluster.SecretsGR, testcluster.Secret("ns", "s", "pw"), "", "", cfg)
	for i := 0; i < 3; i++ {
		main.Put(fmt.Sprintf("/registry/events/ns/old-%d", i), testcluster.EventsGR, testcluster.Event("ns", fmt.Sprintf("old-%d", i)), "", "application/json", "")
		events.Put(fmt.Sprintf("/registry/events/ns/e-%d", i), testcluster.EventsGR, testcluster.Event("ns", fmt.Sprintf("e-%d", i)), "", "application/json", "")
	}
	flags := filepath.Join(t.TempDir(), "kube-apiserver.flags")
	line := fmt.Sprintf("--etcd-servers=http://%s --etcd-servers-overrides=/events#http://%s --encryption-provider-config=%s\n", main.Srv.Endpoint, events.Srv.Endpoint, cfg)
	if err := os.WriteFile(flags, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	mainBefore, eventsBefore := main.Raw(), events.Raw()

	// A dry run: both etcds decided, nothing written, no run directory.
	code, out, stderr := runCLI(t, "migrate", "--apiserver-flags-file", flags, "--target-version", "1.37", "--dry-run")
	if code != exitOK || !strings.Contains(out, "== main etcd (http://"+main.Srv.Endpoint+")") || !strings.Contains(out, "== etcd of events (http://"+events.Srv.Endpoint+")") ||
		!equalRaw(main.Raw(), mainBefore) || !equalRaw(events.Raw(), eventsBefore) {
		t.Errorf("migrate --dry-run: exit %d, want both etcds reported and nothing written\n%s%s", code, out, stderr)
	}
	// --resource picks among the etcds: only the main etcd's secrets.
	code, out, stderr = runCLI(t, "verify", "--apiserver-flags-file", flags, "--target-version", "1.37", "--resource", "secrets")
	if code != exitOK || !strings.Contains(out, "== main etcd") || strings.Contains(out, "== etcd of events") {
		t.Errorf("verify --resource secrets: exit %d, want the main etcd alone, current\n%s%s", code, out, stderr)
	}

	code, out, stderr = runCLI(t, "migrate", "--apiserver-flags-file", flags, "--target-version", "1.37", "--allow-live-apiserver", "-o", "json")
	if code != exitOK {
		t.Fatalf("migrate: exit %d\n%s%s", code, out, stderr)
	}
	var rep struct {
		Etcds []struct {
			Etcd      string   `json:"etcd"`
			Endpoints []string `json:"endpoints"`
			Summary   struct{ Stale, Rewritten int64 }
		} `json:"etcds"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("migrate -o json: %v\n%s", err, out)
	}
	if len(rep.Etcds) != 2 || rep.Etcds[0].Etcd != "" || rep.Etcds[0].Summary.Rewritten != 0 || rep.Etcds[1].Etcd != "events" ||
		rep.Etcds[1].Summary.Rewritten != 3 || strings.Join(rep.Etcds[1].Endpoints, ",") != events.Srv.URL {
		t.Errorf("migrate's report per etcd: %+v, want nothing rewritten in the main etcd and the 3 events in the other (%s)", rep.Etcds, events.Srv.URL)
	}
	if got := main.Raw(); !equalRaw(got, mainBefore) {
		t.Error("the main etcd changed: its events from before the override are not kube-apiserver's, the secret was current")
	}
	for k, v := range events.Raw() {
		if v == eventsBefore[k] {
			t.Errorf("%s: not rewritten", k)
		}
	}
	run := filepath.Join(testcluster.StateDir(t), "runs", "0001-migrate")
	var rec struct {
		Etcds []struct{ Name, Journal, Snapshot string } `json:"etcds"`
	}
	data, err := os.ReadFile(filepath.Join(run, "run.json"))
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err != nil || len(rec.Etcds) != 1 || rec.Etcds[0].Name != "events" || rec.Etcds[0].Journal != filepath.Join(run, "journal-events") || rec.Etcds[0].Snapshot != filepath.Join(run, "snapshot-events.db") {
		t.Errorf("run.json's etcds: %+v (%v)", rec.Etcds, err)
	}

	code, out, stderr = runCLI(t, "runs")
	if code != exitOK || !strings.Contains(out, "none + etcd of events (--show 0001-migrate)") {
		t.Errorf("runs: exit %d, want the events etcd's undo pointed at\n%s\n%s", code, out, stderr)
	}
	code, out, stderr = runCLI(t, "runs", "--verify")
	if code != exitOK || !strings.Contains(out, "verified") {
		t.Errorf("runs --verify: exit %d\n%s\n%s", code, out, stderr)
	}
	// Damaged: the events etcd's journal cut short.
	ej := filepath.Join(run, "journal-events")
	good, err := os.ReadFile(ej)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ej, good[:len(good)-10], 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr = runCLI(t, "runs", "--verify")
	if code != exitError || !strings.Contains(out, "0001-migrate: DAMAGED: etcd of events: ") {
		t.Errorf("runs --verify of a cut journal-events: exit %d, want 1 naming it\n%s\n%s", code, out, stderr)
	}
	if err := os.WriteFile(ej, good, 0o600); err != nil {
		t.Fatal(err)
	}

	code, out, stderr = runCLI(t, "runs", "--show", "0001-migrate")
	if code != exitOK || !strings.Contains(out, "etcd events") || !strings.Contains(out, filepath.Join(run, "journal-events")+" (") || !strings.Contains(out, filepath.Join(run, "snapshot-events.db")+" (") {
		t.Errorf("runs show: exit %d, want the events etcd's journal and snapshot named\n%s\n%s", code, out, stderr)
	}

	// One journal of another etcd: not on the main etcd.
	code, _, stderr = runCLI(t, "rollback", "--apiserver-flags-file", flags, "--journal", filepath.Join(run, "journal-events"), "--allow-live-apiserver")
	if code != exitUsage || !strings.Contains(stderr, "is run 0001-migrate's journal in the etcd of events (http://"+events.Srv.Endpoint+"), not the main etcd") {
		t.Errorf("rollback --journal journal-events: exit %d, want 2\n%s", code, stderr)
	}

	code, out, stderr = runCLI(t, "rollback", "--apiserver-flags-file", flags, "--run", "0001-migrate", "--allow-live-apiserver", "--encryption-provider-config", cfg)
	if code != exitOK || !strings.Contains(out, "== etcd of events (") {
		t.Fatalf("rollback: exit %d\n%s%s", code, out, stderr)
	}
	if !equalRaw(events.Raw(), eventsBefore) || !equalRaw(main.Raw(), mainBefore) {
		t.Error("rollback did not put both etcds back byte for byte")
	}

	// --resource events: the events etcd alone, its undo under its own
	// names (no main journal), undone by rollback --run.
	code, out, stderr = runCLI(t, "migrate", "--apiserver-flags-file", flags, "--target-version", "1.37", "--allow-live-apiserver", "--resource", "events")
	if code != exitOK || strings.Contains(out, "== main etcd") || !strings.Contains(out, "== etcd of events") {
		t.Fatalf("migrate --resource events: exit %d\n%s%s", code, out, stderr)
	}
	run3 := filepath.Join(testcluster.StateDir(t), "runs", "0003-migrate")
	if _, err := os.Stat(filepath.Join(run3, "journal-events")); err != nil {
		t.Errorf("migrate --resource events: %v", err)
	}
	if _, err := os.Stat(filepath.Join(run3, "journal")); err == nil {
		t.Error("migrate --resource events kept a journal for the main etcd")
	}
	code, out, stderr = runCLI(t, "rollback", "--apiserver-flags-file", flags, "--run", "0003-migrate", "--allow-live-apiserver", "--encryption-provider-config", cfg)
	if code != exitOK || !equalRaw(events.Raw(), eventsBefore) || !equalRaw(main.Raw(), mainBefore) {
		t.Fatalf("rollback --run 0003-migrate: exit %d, or not byte for byte\n%s%s", code, out, stderr)
	}

	// plan: a plan per etcd; the other etcd's data directory is not the
	// one a manifest names (its growth not counted, said).
	code, out, stderr = runCLI(t, "plan", "--apiserver-flags-file", flags, "--target-version", "1.37")
	if code != exitOK || !strings.Contains(out, "== etcd of events (http://"+events.Srv.Endpoint+")") ||
		!strings.Contains(out, "unknown: the etcd of events (--etcd-servers-overrides) is not the one whose manifest or layout is known") {
		t.Errorf("plan: exit %d\n%s%s", code, out, stderr)
	}

	// --endpoints: the main etcd only, said on stderr.
	code, out, stderr = runCLI(t, "verify", "--apiserver-flags-file", flags, "--endpoints", main.Srv.Endpoint, "--target-version", "1.37")
	if code != exitStale || !strings.Contains(stderr, "note: --endpoints replaces the main etcd (--etcd-servers) only: events stay in the etcd --etcd-servers-overrides names (http://"+events.Srv.Endpoint+")") ||
		!strings.Contains(out, "== etcd of events (http://"+events.Srv.Endpoint+")") {
		t.Errorf("verify with --endpoints: exit %d\n%s%s", code, out, stderr)
	}
	// A command that reads one etcd.
	code, _, stderr = runCLI(t, "inventory", "--apiserver-flags-file", flags)
	if code != exitUsage || !strings.Contains(stderr, "inventory does not handle a cluster kept in several etcds") {
		t.Errorf("inventory: exit %d\n%s", code, stderr)
	}
}

func equalRaw(a, b map[string]string) bool {
	return len(rawDiff(a, b)) == 0
}

// rawDiff names the keys whose values differ between a and b (or that only
// one has).
func rawDiff(a, b map[string]string) []string {
	var diff []string
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			diff = append(diff, k)
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diff = append(diff, k)
		}
	}
	slices.Sort(diff)
	return diff
}

// TestOverridesQuotaOfTheOtherEtcd: the events etcd's quota cannot take the
// rewrite of its events, the main etcd has a secret to rewrite: migrate is
// refused before the first write on either etcd (the main etcd, migrated
// first, is left as it was), naming the events etcd.
func TestOverridesQuotaOfTheOtherEtcd(t *testing.T) {
	main := testcluster.New(t, testetcd.Options{})
	events := testcluster.New(t, testetcd.Options{QuotaBackendBytes: 8 << 20})
	oldCfg := main.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := main.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	main.Put("/registry/secrets/ns/s", testcluster.SecretsGR, testcluster.Secret("ns", "s", "pw"), "", "", oldCfg)
	// 5 MiB of Events stored as JSON (stale by media type) in an 8 MiB quota.
	for i := 0; i < 100; i++ {
		e := testcluster.Event("ns", fmt.Sprintf("e-%03d", i))
		e.Message = strings.Repeat("x", 48<<10)
		events.Put(fmt.Sprintf("/registry/events/ns/e-%03d", i), testcluster.EventsGR, e, "", "application/json", "")
	}
	// etcd commits its backend every 100 ms: until it has, its status says
	// a database without the events (and the quota check lets the run in).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st, err := events.Cli.Status(context.Background(), events.Srv.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		if st.DbSizeInUse >= 4<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the events etcd's database holds %d bytes in use after 10 s, want the events' 4.7 MiB", st.DbSizeInUse)
		}
	}
	flags := filepath.Join(t.TempDir(), "kube-apiserver.flags")
	line := fmt.Sprintf("--etcd-servers=http://%s --etcd-servers-overrides=/events#http://%s --encryption-provider-config=%s\n", main.Srv.Endpoint, events.Srv.Endpoint, newCfg)
	if err := os.WriteFile(flags, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	mainBefore, eventsBefore := main.Raw(), events.Raw()
	code, out, stderr := runCLI(t, "migrate", "--apiserver-flags-file", flags, "--target-version", "1.37", "--allow-live-apiserver")
	if code != exitError || !strings.Contains(stderr, "error: etcd of events: preflight: ") || !strings.Contains(stderr, "quota") {
		t.Errorf("migrate: exit %d, want 1 naming the events etcd's quota\n%s%s", code, out, stderr)
	}
	if d := rawDiff(mainBefore, main.Raw()); len(d) > 0 {
		t.Errorf("a refused run wrote to the main etcd: %s\n%s", strings.Join(d, ", "), stderr)
	}
	if d := rawDiff(eventsBefore, events.Raw()); len(d) > 0 {
		t.Errorf("a refused run wrote to the events etcd: %s\n%s", strings.Join(d, ", "), stderr)
	}
}

// TestOverridesReleaseFromKubeadm: nothing on the command line names the
// release, kubeadm's ClusterConfiguration in the main etcd does: the events
// etcd, which holds no kubeadm-config, is migrated for that release too.
func TestOverridesReleaseFromKubeadm(t *testing.T) {
	main := testcluster.New(t, testetcd.Options{})
	events := testcluster.New(t, testetcd.Options{})
	main.Put("/registry/configmaps/kube-system/kubeadm-config", testcluster.ConfigMapsGR, kubeadmConfig("v1.36.3"), "", "", "")
	events.Put("/registry/events/ns/e", testcluster.EventsGR, testcluster.Event("ns", "e"), "", "application/json", "")
	flags := filepath.Join(t.TempDir(), "kube-apiserver.flags")
	line := fmt.Sprintf("--etcd-servers=http://%s --etcd-servers-overrides=/events#http://%s\n", main.Srv.Endpoint, events.Srv.Endpoint)
	if err := os.WriteFile(flags, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, stderr := runCLI(t, "migrate", "--apiserver-flags-file", flags, "--allow-live-apiserver", "-o", "json")
	if code != exitOK || strings.Count(stderr, "release 1.36 (kubeadm-config in etcd)") != 2 {
		t.Fatalf("migrate: exit %d, want both etcds' sessions at 1.36 from kubeadm-config\n%s%s", code, out, stderr)
	}
	var rep struct {
		Etcds []struct {
			Etcd    string `json:"etcd"`
			Summary struct{ Rewritten int64 }
		} `json:"etcds"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Etcds) != 2 || rep.Etcds[1].Summary.Rewritten != 1 {
		t.Errorf("migrate's report: %+v (%v), want the event rewritten", rep.Etcds, err)
	}
}
