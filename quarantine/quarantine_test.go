package quarantine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kubernetes/pkg/apis/coordination"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/quarantine"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/target"
	"kube-etcd-migrate/undo"
	"kube-etcd-migrate/verify"
)

// lostKey is a cluster whose secrets and configmaps were written under key1
// (then lost: the configuration now has key2 only), key2, identity, and a few
// that are damaged or refused by a configured key.
type lostKey struct {
	c                               *testcluster.Cluster
	cfg                             string // what the operator has now: aescbc key2 (its right material), identity
	lost                            []string
	leased                          string // a configmap under key1 attached to a lease
	lease                           clientv3.LeaseID
	damagedEnvelope, damagedPayload string
	refused                         []string // key2's name, other material
	readable                        []string
	before                          map[string][]byte
}

func newLostKey(t *testing.T) *lostKey {
	t.Helper()
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	k := &lostKey{c: c, before: map[string][]byte{}}
	key1 := c.EncryptionConfig("key1.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	key2 := c.EncryptionConfig("key2.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	otherKey2 := c.EncryptionConfig("other-key2.yaml", testcluster.AESCBC("key2", 3), testcluster.Identity)
	k.cfg = key2
	for i := 0; i < 4; i++ {
		key := fmt.Sprintf("/registry/secrets/app/old-%d", i)
		c.Put(key, testcluster.SecretsGR, testcluster.Secret("app", fmt.Sprintf("old-%d", i), "pw"), "", "", key1)
		k.lost = append(k.lost, key)
		key = fmt.Sprintf("/registry/secrets/app/new-%d", i)
		c.Put(key, testcluster.SecretsGR, testcluster.Secret("app", fmt.Sprintf("new-%d", i), "pw"), "", "", key2)
		k.readable = append(k.readable, key)
	}
	for i := 0; i < 3; i++ {
		key := fmt.Sprintf("/registry/secrets/app/wrong-material-%d", i)
		c.Put(key, testcluster.SecretsGR, testcluster.Secret("app", fmt.Sprintf("wrong-material-%d", i), "pw"), "", "", otherKey2)
		k.refused = append(k.refused, key)
	}
	k.readable = append(k.readable, "/registry/secrets/kube-system/plain")
	c.Put("/registry/secrets/kube-system/plain", testcluster.SecretsGR, testcluster.Secret("kube-system", "plain", "pw"), "", "", "")
	k.damagedEnvelope = "/registry/secrets/app/no-key-name"
	c.PutRaw(k.damagedEnvelope, []byte("k8s:enc:aescbc:v1:"))
	k.damagedPayload = "/registry/configmaps/app/garbage"
	c.PutRaw(k.damagedPayload, []byte("k8s\x00\x0a\x0fnot a protobuf"))
	lease, err := c.Cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	k.lease = lease.ID
	k.leased = "/registry/configmaps/app/leased-old"
	c.Put(k.leased, testcluster.ConfigMapsGR, testcluster.ConfigMap("app", "leased-old"), "", "", key1, clientv3.WithLease(lease.ID))
	k.lost = append(k.lost, k.leased)
	c.Put("/registry/configmaps/app/fine", testcluster.ConfigMapsGR, testcluster.ConfigMap("app", "fine"), "", "", key2)
	k.readable = append(k.readable, "/registry/configmaps/app/fine")
	resp, err := c.Cli.Get(ctx, "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		k.before[string(kv.Key)] = kv.Value
	}
	return k
}

func keysWith(r *quarantine.Result, status string) []string {
	var out []string
	for _, e := range r.Entries {
		if e.Status == status {
			out = append(out, e.Key)
		}
	}
	sort.Strings(out)
	return out
}

func sorted(ss ...[]string) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s...)
	}
	sort.Strings(out)
	return out
}

func TestParseReasons(t *testing.T) {
	got, err := quarantine.ParseReasons([]string{"undecryptable,corrupt-payload", "undecryptable"})
	if err != nil || !cmp.Equal(got, []decode.Reason{decode.ReasonUndecryptable, decode.ReasonCorruptPayload}) {
		t.Errorf("got %v, %v", got, err)
	}
	for _, bad := range [][]string{nil, {""}, {"would-lose-fields"}, {"not-an-object"}, {"unknown-resource"}, {"everything"}} {
		var oe *quarantine.OptionError
		if _, err := quarantine.ParseReasons(bad); !errors.As(err, &oe) || oe.Option != quarantine.OptionReasons {
			t.Errorf("%q: %v, want an error about the reasons", bad, err)
		}
	}
}

// TestDryRunListsOnlyWhatIsNamed: a dry run lists the objects of the named
// resources unreadable for the named reasons, keeps the rest (with why), and
// writes nothing.
func TestDryRunListsOnlyWhatIsNamed(t *testing.T) {
	k := newLostKey(t)
	before := k.c.Revision()
	env := k.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets"}})
	res, err := quarantine.Run(context.Background(), env, quarantine.Options{Reasons: []decode.Reason{decode.ReasonUndecryptable}, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	wantLost := k.lost[:len(k.lost)-1] // the leased configmap is not a secret
	if d := cmp.Diff(sorted(wantLost), keysWith(res, quarantine.StatusWouldRemove)); d != "" {
		t.Errorf("would remove (-want +got):\n%s", d)
	}
	if d := cmp.Diff(sorted(k.refused, []string{k.damagedEnvelope}), keysWith(res, quarantine.StatusKept)); d != "" {
		t.Errorf("kept (-want +got):\n%s", d)
	}
	for _, e := range res.Entries {
		if e.Status == quarantine.StatusKept && !strings.Contains(e.Note, "refused") && !strings.Contains(e.Note, "not among those named") {
			t.Errorf("%s kept without a reason: %+v", e.Key, e)
		}
	}
	if k.c.Revision() != before {
		t.Error("a dry run wrote")
	}
}

func TestRefusals(t *testing.T) {
	k := newLostKey(t)
	ctx := context.Background()
	reasons := []decode.Reason{decode.ReasonUndecryptable}
	for _, tc := range []struct {
		cfg  pipeline.Config
		opts quarantine.Options
		want quarantine.Option
	}{
		{pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}}, quarantine.Options{Reasons: reasons, Journal: "j"}, quarantine.OptionResources},
		{pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets"}}, quarantine.Options{Journal: "j"}, quarantine.OptionReasons},
		{pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets"}}, quarantine.Options{Reasons: reasons}, quarantine.OptionJournal},
	} {
		before := k.c.Revision()
		_, err := quarantine.Run(ctx, k.c.Env(tc.cfg), tc.opts)
		var oe *quarantine.OptionError
		if !errors.As(err, &oe) || oe.Option != tc.want {
			t.Errorf("%+v: %v, want an error about %s", tc.opts, err, tc.want)
		}
		if k.c.Revision() != before {
			t.Error("wrote despite the refusal")
		}
	}

	// A kube-apiserver renews its identity lease during the window (its
	// renewTime reads 10 minutes old: its node's clock is slow): refused, as
	// migrate does, naming the lease.
	renew := metav1.NewMicroTime(time.Now().Add(-10 * time.Minute))
	holder := "apiserver-abc_1"
	leaseKey := "/registry/leases/kube-system/apiserver-abc"
	value := k.c.Encode(leaseKey, schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, &coordination.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "apiserver-abc", Namespace: "kube-system", UID: "u", CreationTimestamp: metav1.Unix(1700000000, 0),
			Labels: map[string]string{"apiserver.kubernetes.io/identity": "kube-apiserver"}},
		Spec: coordination.LeaseSpec{HolderIdentity: &holder, RenewTime: &renew},
	}, "", "", "")
	renewing, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		for renewing.Err() == nil {
			_, _ = k.c.Cli.Put(renewing, leaseKey, string(value))
			time.Sleep(100 * time.Millisecond)
		}
	}()
	journal := filepath.Join(t.TempDir(), "q.journal")
	env := k.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets"}})
	before := keysIn(t, k.c.Cli, leaseKey)
	_, err := quarantine.Run(ctx, env, quarantine.Options{Reasons: reasons, Journal: journal, LivenessWindow: 500 * time.Millisecond})
	stopRenewing()
	<-renewed
	if err == nil || !strings.Contains(err.Error(), "a kube-apiserver is alive") || !strings.Contains(err.Error(), leaseKey) {
		t.Errorf("live apiserver: %v", err)
	}
	if d := cmp.Diff(before, keysIn(t, k.c.Cli, leaseKey)); d != "" {
		t.Errorf("removed objects while a kube-apiserver was alive (-before +after):\n%s", d)
	}
	// A snapshot file read in place, written to an output snapshot: no
	// kube-apiserver can reach either, so no watch and no journal; the
	// removed keys are not in the output, every other key is there byte for
	// byte, and the input is not modified.
	dir := t.TempDir()
	in, out := filepath.Join(dir, "backup.db"), filepath.Join(dir, "out.db")
	if err := etcdscan.Snapshot(ctx, k.c.Cli, in); err != nil {
		t.Fatal(err)
	}
	inBytes, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	file, err := snapshotdb.Open(in, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	fenv, err := pipeline.SetupSource(ctx, file, pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets"}, SnapshotFile: in})
	if err != nil {
		t.Fatal(err)
	}
	defer fenv.Close()
	w, err := snapshotdb.NewWriter(ctx, file, out, snapshotdb.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	res, err := quarantine.Run(ctx, fenv, quarantine.Options{Reasons: reasons, Output: w, OutputFile: out})
	if err != nil || res.Removed != 4 || res.Journal != "" {
		t.Fatalf("output snapshot: %v, removed %d, journal %q", err, res.Removed, res.Journal)
	}
	if _, err := w.Finish(ctx, false); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(in); !bytes.Equal(after, inBytes) {
		t.Error("the input snapshot changed")
	}
	outFile, err := snapshotdb.Open(out, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer outFile.Close()
	all, err := k.c.Cli.Get(ctx, "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	gone := keysWith(res, quarantine.StatusRemoved)
	for _, kv := range all.Kvs {
		key := string(kv.Key)
		got, found, err := outFile.Get(ctx, key, 0)
		switch {
		case err != nil:
			t.Fatal(err)
		case slices.Contains(gone, key) && found:
			t.Errorf("%s: removed, but in the output", key)
		case !slices.Contains(gone, key) && (!found || !bytes.Equal(got.Value, kv.Value)):
			t.Errorf("%s: not in the output as it was", key)
		}
	}
}

// TestQuarantineThenRollback removes what no key decrypts and what does not
// decode (secrets and configmaps, a leased one among them), never a readable
// object nor one a configured key refused; verify then finds only those refused
// ones; rollback puts every removed value back byte for byte, with its lease,
// or without it, and says so, when the lease is gone.
func TestQuarantineThenRollback(t *testing.T) {
	k := newLostKey(t)
	ctx := context.Background()
	journal := filepath.Join(t.TempDir(), "quarantine.journal")
	env := k.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets", "configmaps"}})
	res, err := quarantine.Run(ctx, env, quarantine.Options{
		Reasons:            []decode.Reason{decode.ReasonUndecryptable, decode.ReasonCorruptEnvelope, decode.ReasonCorruptPayload},
		Journal:            journal,
		AllowLiveAPIServer: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	removed := sorted(k.lost, []string{k.damagedEnvelope, k.damagedPayload})
	if d := cmp.Diff(removed, keysWith(res, quarantine.StatusRemoved)); d != "" {
		t.Errorf("removed (-want +got):\n%s", d)
	}
	if d := cmp.Diff(sorted(k.refused), keysWith(res, quarantine.StatusKept)); d != "" {
		t.Errorf("kept (-want +got):\n%s", d)
	}
	if res.Conflicts != 0 || res.Failed != 0 {
		t.Errorf("conflicts %d failed %d", res.Conflicts, res.Failed)
	}
	if fi, err := os.Stat(journal); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("journal: %v %v, want mode 0600", fi, err)
	}
	for _, key := range removed {
		if v, _ := get(t, k.c.Cli, key); v != nil {
			t.Errorf("%s still there", key)
		}
	}
	for _, key := range append(append([]string{}, k.readable...), k.refused...) {
		if v, _ := get(t, k.c.Cli, key); !bytes.Equal(v, k.before[key]) {
			t.Errorf("%s changed by the quarantine", key)
		}
	}
	rep, err := verify.Run(ctx, k.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"secrets", "configmaps"}}), verify.Options{ShowKeys: 20})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Summary.Unreadable != int64(len(k.refused)) {
		t.Errorf("after the quarantine verify finds %d unreadable, want the %d refused ones", rep.Summary.Unreadable, len(k.refused))
	}

	// The lease of one removed configmap is gone by the time of the rollback:
	// that one comes back without a lease. A second configmap shows the other case.
	if _, err := k.c.Cli.Revoke(ctx, k.lease); err != nil {
		t.Fatal(err)
	}
	rb, err := rollback.Rollback(ctx, k.c.Cli, journal, &etcdscan.Writer{Client: k.c.Cli})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Restored != len(removed) || rb.Skipped != 0 || rb.Failed != 0 || len(rb.Notes) != 1 || !strings.Contains(rb.Notes[0], k.leased) {
		t.Errorf("rollback %+v, want %d restored and a note on %s", rb, len(removed), k.leased)
	}
	for _, key := range removed {
		v, lease := get(t, k.c.Cli, key)
		if !bytes.Equal(v, k.before[key]) {
			t.Errorf("%s: not restored byte for byte", key)
		}
		if lease != 0 {
			t.Errorf("%s: restored with lease %x", key, lease)
		}
	}
	// Again: nothing to do.
	rb, err = rollback.Rollback(ctx, k.c.Cli, journal, &etcdscan.Writer{Client: k.c.Cli})
	if err != nil || rb.Restored != 0 || rb.Unchanged != len(removed) {
		t.Errorf("second rollback %+v %v", rb, err)
	}
}

// TestRollbackKeepsLiveLease: a removed key whose lease is still alive comes
// back attached to it; a key created again since is left alone.
func TestRollbackKeepsLiveLease(t *testing.T) {
	k := newLostKey(t)
	ctx := context.Background()
	journal := filepath.Join(t.TempDir(), "quarantine.journal")
	env := k.c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: k.cfg}, Resources: []string{"configmaps", "secrets"}})
	res, err := quarantine.Run(ctx, env, quarantine.Options{Reasons: []decode.Reason{decode.ReasonUndecryptable}, Journal: journal, AllowLiveAPIServer: true})
	if err != nil || res.Removed != int64(len(k.lost)) {
		t.Fatalf("%v, removed %d", err, res.Removed)
	}
	k.c.PutRaw(k.lost[0], []byte("created again by someone"))
	rb, err := rollback.Rollback(ctx, k.c.Cli, journal, &etcdscan.Writer{Client: k.c.Cli})
	if err != nil {
		t.Fatal(err)
	}
	if rb.Restored != len(k.lost)-1 || rb.Skipped != 1 || len(rb.Notes) != 0 || !strings.Contains(strings.Join(rb.Keys, " "), k.lost[0]) {
		t.Errorf("rollback %+v", rb)
	}
	v, lease := get(t, k.c.Cli, k.leased)
	if !bytes.Equal(v, k.before[k.leased]) || lease != int64(k.lease) {
		t.Errorf("%s: restored with lease %x, want %x and its old value", k.leased, lease, int64(k.lease))
	}
	if v, _ := get(t, k.c.Cli, k.lost[0]); string(v) != "created again by someone" {
		t.Errorf("%s overwritten by the rollback", k.lost[0])
	}
}

func get(t *testing.T, cli *clientv3.Client, key string) ([]byte, int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0
	}
	return resp.Kvs[0].Value, resp.Kvs[0].Lease
}

// keysIn is every key under /registry/ but except, with its value and mod
// revision.
func keysIn(t *testing.T, cli *clientv3.Client, except string) map[string]string {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/registry/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		if string(kv.Key) != except {
			out[string(kv.Key)] = fmt.Sprintf("%q@%d", kv.Value, kv.ModRevision)
		}
	}
	return out
}

// TestQuarantineStopsAtAnotherWriter: once quarantine removes, another
// writer under the prefix (a kube-scheduler lease, as only a kube-apiserver
// would write it) stops it: exit 5's error, no more removals than were in
// flight, every removal journaled, and the rollback puts every one back.
func TestQuarantineStopsAtAnotherWriter(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	key1 := c.EncryptionConfig("key1.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	key2 := c.EncryptionConfig("key2.yaml", testcluster.AESCBC("key2", 2), testcluster.Identity)
	const n = 300
	c.SeedMany(n, key1) // key1 lost: the configuration has key2 only
	ctx := context.Background()
	before := map[string]string{}
	for k, v := range c.Raw() {
		if strings.HasPrefix(k, "/registry/secrets/") {
			before[k] = v
		}
	}
	other := "/registry/leases/kube-system/kube-scheduler"
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wrote := make(chan error, 1)
	wch := c.Cli.Watch(wctx, "/registry/secrets/", clientv3.WithPrefix(), clientv3.WithRev(c.Revision()+1), clientv3.WithFilterPut())
	go func() {
		for resp := range wch {
			if len(resp.Events) > 0 {
				_, err := c.Cli.Put(ctx, other, "x")
				wrote <- err
				return
			}
		}
	}()
	journal := filepath.Join(t.TempDir(), "q.journal")
	env := c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: key2}, Resources: []string{"secrets"}})
	res, err := quarantine.Run(ctx, env, quarantine.Options{Reasons: []decode.Reason{decode.ReasonUndecryptable}, Journal: journal, LivenessWindow: 500 * time.Millisecond, BatchOps: 1})
	if werr := <-wrote; werr != nil {
		t.Fatal(werr)
	}
	var we *liveness.WriterError
	if !errors.As(err, &we) || !strings.Contains(err.Error(), other+" written") {
		t.Fatalf("err = %v, want a writer's stop naming %s", err, other)
	}
	if res.Removed == 0 || res.Removed >= n || res.Failed != 0 {
		t.Fatalf("removed %d of %d, failed %d: want a run stopped part-way", res.Removed, n, res.Failed)
	}
	deleted := map[string]bool{}
	if err := undo.ReadJournal(journal, func(r undo.JournalRecord) error {
		if r.Op == "deleted" {
			deleted[r.Key] = true
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	gone := 0
	for k := range before {
		if !present(t, c, k) {
			gone++
			if !deleted[k] {
				t.Errorf("%s removed but not journaled", k)
			}
		}
	}
	if int64(gone) != res.Removed {
		t.Errorf("%d secrets gone, %d removed", gone, res.Removed)
	}
	if r, err := rollback.Rollback(ctx, c.Cli, journal, &etcdscan.Writer{Client: c.Cli}); err != nil || int64(r.Restored) != res.Removed {
		t.Fatalf("rollback: %+v, %v", r, err)
	}
	for k, v := range c.Raw() {
		if b, ok := before[k]; ok && b != v {
			t.Errorf("%s not restored byte for byte", k)
		}
	}
}

func present(t *testing.T, c *testcluster.Cluster, key string) bool {
	t.Helper()
	resp, err := c.Cli.Get(context.Background(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count == 1
}
