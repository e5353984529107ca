package e2e

import (
	"bytes"
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"path/filepath"
	"strings"
	"testing"

	etcdutl "go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/quarantine"
	"kube-etcd-migrate/rollback"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/verify"
)

// verifySnapshotFile runs the gate "this backup restores with these keys",
// reading the file in place as `verify --snapshot-file` does.
func verifySnapshotFile(t *testing.T, path, encCfg string) *verify.Report {
	t.Helper()
	ctx := context.Background()
	snap, err := snapshotdb.Open(path, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	env, err := pipeline.SetupSource(ctx, snap, pipeline.Config{Target: target.Input{EncryptionConfig: encCfg}, SnapshotFile: path, Revision: snap.Info.Revision})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	rep, err := verify.Run(ctx, env, verify.Options{ShowKeys: 20})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// restoreCluster restores a snapshot file with etcd's own restore code
// (etcdutl snapshot restore) into a new data directory and starts an etcd on it.
func restoreCluster(t *testing.T, path string) *cluster {
	t.Helper()
	dir := t.TempDir()
	const peer = "http://127.0.0.1:2380" // replaced by the member's own address when it starts
	if err := etcdutl.NewV3(zap.NewNop()).Restore(etcdutl.RestoreConfig{
		SnapshotPath:        path,
		Name:                "testetcd",
		OutputDataDir:       filepath.Join(dir, "data"),
		PeerURLs:            []string{peer},
		InitialCluster:      "testetcd=" + peer,
		InitialClusterToken: "restored",
	}); err != nil {
		t.Fatalf("etcdutl snapshot restore %s: %v", path, err)
	}
	etcd := testetcd.StartT(t, testetcd.Options{Dir: dir})
	return &cluster{t: t, etcd: etcd, cli: etcd.ClientT(t), dir: t.TempDir()}
}

// TestSnapshotReencryption: a backup taken while secrets and configmaps were
// under key1 does not pass the gate for a configuration holding key2 only
// (exit 4); migrate re-encrypts a copy of it to key2 (the backup itself is
// untouched); that copy passes the gate (exit 0) and, restored by etcd's own
// restore code, serves every object through a kube-apiserver that has key2 only.
func TestSnapshotReencryption(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	res := encResources
	key1Only := c.writeEncryptionConfig("key1-only.yaml", res, aescbcProvider("key1", 1))
	createEncrypted(t, c.start(apiservertest.Options{EncryptionConfigPath: key1Only}))
	c.stop()
	assertEncryptedWith(t, c, "k8s:enc:aescbc:v1:key1:", "written under key1")

	backup := filepath.Join(t.TempDir(), "backup.db")
	if err := etcdscan.Snapshot(ctx, c.cli, backup); err != nil {
		t.Fatal(err)
	}
	key2Only := c.writeEncryptionConfig("key2-only.yaml", res, aescbcProvider("key2", 2))
	rep := verifySnapshotFile(t, backup, key2Only)
	if rep.ExitCode() != verify.ExitUnreadable || rep.Summary.Unreadable < 2*encObjects {
		t.Fatalf("gate on the key1 backup with key2 only: exit %d, %d unreadable; want 4 and every secret and configmap", rep.ExitCode(), rep.Summary.Unreadable)
	}

	// Re-encrypt a copy, as `migrate --snapshot-file IN --output-snapshot OUT`
	// does: the backup read in place, the copy written by snapshotdb's Writer.
	rotated := filepath.Join(t.TempDir(), "backup-key2.db")
	in, err := snapshotdb.Open(backup, snapshotdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	env, err := pipeline.SetupSource(ctx, in, pipeline.Config{Target: target.Input{EncryptionConfig: c.writeEncryptionConfig("key2-key1.yaml", res, aescbcProvider("key2", 2), aescbcProvider("key1", 1))}, SnapshotFile: backup})
	if err != nil {
		t.Fatal(err)
	}
	out, err := snapshotdb.NewWriter(ctx, in, rotated, snapshotdb.WriterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := migrate.Run(ctx, env, migrate.Options{Output: out, OutputFile: rotated})
	env.Close()
	if err != nil || sum.Summary.Rewritten < 2*encObjects || sum.Summary.Unreadable != 0 || sum.Summary.Failed != 0 {
		t.Fatalf("migrate of the backup: %v, summary %+v", err, sum.Summary)
	}
	if _, err := out.Finish(ctx, false); err != nil {
		t.Fatal(err)
	}
	if rep := verifySnapshotFile(t, rotated, key2Only); rep.ExitCode() != verify.ExitCurrent {
		t.Fatalf("gate on the re-encrypted copy with key2 only: exit %d, summary %+v", rep.ExitCode(), rep.Summary)
	}
	if rep := verifySnapshotFile(t, backup, key2Only); rep.ExitCode() != verify.ExitUnreadable {
		t.Errorf("the backup itself changed: exit %d", rep.ExitCode())
	}

	// Disaster: the cluster is rebuilt from the re-encrypted backup, key1 is gone.
	restored := restoreCluster(t, rotated)
	assertEncryptedWith(t, restored, "k8s:enc:aescbc:v1:key2:", "restored from the re-encrypted backup")
	rc := restored.start(apiservertest.Options{EncryptionConfigPath: key2Only})
	readBackEncrypted(t, rc, "restored backup, key2 only")
	list, err := kubernetes.NewForConfigOrDie(rc).CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) < encObjects {
		t.Errorf("list every secret of the restored cluster: %v (%d)", err, len(list.Items))
	}
	restored.stop()
}

// TestQuarantineAfterKeyLoss: key1 is lost. A kube-apiserver with key2 only
// cannot LIST secrets (an undecryptable secret fails the list) nor become
// healthy, and the quarantine refuses to run beside it; once it is stopped, the quarantine
// removes exactly the secrets under key1; kube-apiserver LISTs secrets again
// and serves those under key2; rollback puts the removed values back byte for
// byte.
func TestQuarantineAfterKeyLoss(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	res := []string{"secrets"}
	key1 := c.writeEncryptionConfig("key1.yaml", res, aescbcProvider("key1", 1))
	cs := kubernetes.NewForConfigOrDie(c.start(apiservertest.Options{EncryptionConfigPath: key1}))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: encNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createSecrets(t, cs, "old", encObjects)
	c.stop()

	// key1 lost: kube-apiserver with key2 only.
	key2Only := c.writeEncryptionConfig("key2-only.yaml", res, aescbcProvider("key2", 2))
	rc := c.start(apiservertest.Options{EncryptionConfigPath: key2Only, SkipHealthz: true})
	cs = kubernetes.NewForConfigOrDie(rc)
	createSecrets(t, cs, "new", encObjects)
	// kube-apiserver cannot fill its watch cache of secrets: every LIST fails
	// ("corrupt object ... not transformable" in 1.37) and it never becomes
	// healthy (storage-readiness).
	if _, err := cs.CoreV1().Secrets(encNS).List(ctx, metav1.ListOptions{}); err == nil || !strings.Contains(err.Error(), "not transformable") {
		t.Fatalf("LIST secrets with key1 lost: %v; want the undecryptable secrets to fail it", err)
	}
	if _, err := cs.CoreV1().RESTClient().Get().AbsPath("/healthz").Param("verbose", "1").DoRaw(ctx); err == nil || !strings.Contains(err.Error(), "[-]poststarthook/storage-readiness failed") {
		t.Errorf("/healthz with key1 lost: %v; want storage-readiness failing", err)
	}
	journal := filepath.Join(c.dir, "quarantine.journal")
	qopts := quarantine.Options{Reasons: []decode.Reason{decode.ReasonUndecryptable}, Journal: journal}
	cfg := pipeline.Config{Target: target.Input{EncryptionConfig: key2Only}, Resources: res}
	env := c.env(cfg)
	if _, err := quarantine.Run(ctx, env, qopts); err == nil || !strings.Contains(err.Error(), "a kube-apiserver is alive") {
		t.Errorf("quarantine beside a running kube-apiserver: %v, want a refusal", err)
	}
	env.Close()
	c.stop()

	before := map[string][]byte{}
	for i := 0; i < encObjects; i++ {
		key := fmt.Sprintf("/registry/secrets/%s/old-%d", encNS, i)
		before[key], _, _ = etcdValue(t, c.cli, key)
	}
	env = c.env(cfg)
	// The kube-apiserver was stopped by the test a moment ago: its master
	// lease's etcd lease may not have expired yet.
	qopts.AllowLiveAPIServer = true
	q, err := quarantine.Run(ctx, env, qopts)
	env.Close()
	if err != nil {
		t.Fatal(err)
	}
	if q.Removed != encObjects || q.Kept != 0 || q.Conflicts != 0 || q.Failed != 0 {
		t.Fatalf("quarantine: %+v, want the %d secrets under key1 removed", q, encObjects)
	}
	for _, e := range q.Entries {
		if before[e.Key] == nil {
			t.Errorf("removed %s, not one of the secrets under key1", e.Key)
		}
	}

	cs = kubernetes.NewForConfigOrDie(c.start(apiservertest.Options{EncryptionConfigPath: key2Only}))
	list, err := cs.CoreV1().Secrets(encNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("LIST secrets after the quarantine: %v", err)
	}
	if len(list.Items) != encObjects {
		t.Errorf("listed %d secrets, want the %d under key2", len(list.Items), encObjects)
	}
	for i := 0; i < encObjects; i++ {
		s, err := cs.CoreV1().Secrets(encNS).Get(ctx, fmt.Sprintf("new-%d", i), metav1.GetOptions{})
		if err != nil || !bytes.Equal(s.Data["password"], secretData(i)["password"]) {
			t.Errorf("secret new-%d: %v", i, err)
		}
		if _, err := cs.CoreV1().Secrets(encNS).Get(ctx, fmt.Sprintf("old-%d", i), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("secret old-%d after the quarantine: %v, want not found", i, err)
		}
	}
	c.stop()

	rb, err := rollback.Rollback(ctx, c.cli, journal, &etcdscan.Writer{Client: c.cli})
	if err != nil || rb.Restored != encObjects || rb.Failed != 0 || rb.Skipped != 0 {
		t.Fatalf("rollback: %+v %v", rb, err)
	}
	for key, want := range before {
		if got, _, _ := etcdValue(t, c.cli, key); !bytes.Equal(got, want) {
			t.Errorf("%s: rollback did not restore the value byte for byte", key)
		}
	}
}

func createSecrets(t *testing.T, cs kubernetes.Interface, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := cs.CoreV1().Secrets(encNS).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", prefix, i)}, Data: secretData(i)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}
