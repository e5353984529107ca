package e2e

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/everyresource"
	"kube-etcd-migrate/kinedb"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/verify"
)

// TestK3sSQLiteOlderTarget: an older target proven on kine by its own
// kube-apiserver, as TestTargetOlderReleases proves it on etcd. The real
// kube-apiserver of the release two before the linked one (1.35) on kine
// over SQLite, on a k3s node, writes one object of every resource under
// key1; the key is rotated and the tool, finding the datastore through
// --node-root, migrates with --target-version of the previous release
// (1.36), the cluster's next upgrade: every object is stale by its key, and
// those of the resources the two releases store in different versions
// (VolumeAttributesClasses: storage.k8s.io/v1beta1 in 1.35, v1 in 1.36;
// the test's premise, asserted from the tool's verify and the release
// data) by their storage version too. verify then says current (exit 0)
// with key2 alone, inspect shows each of those objects stored in the
// target's version under key2, and the target release's own kube-apiserver
// (its binary) on kine with key2 alone serves every object as 1.35 served
// it, and a no-op update of each keeps its resourceVersion, those of the
// version-stale resources included, every one of them: had the tool written
// another version or other bytes than 1.36 writes, 1.36 would write them
// again. Rollback, plan, backups and the linked release as the target are
// TestK3sSQLite's.
func TestK3sSQLiteOlderTarget(t *testing.T) {
	writer, target := modbuild.OlderKubernetes[1], modbuild.OlderKubernetes[0]
	writerMinor, targetMinor := releaseMinor(t, writer), releaseMinor(t, target)
	ctx := context.Background()
	node := writtenSQLiteNode(t, writer)
	root, db, enc, res, served, since := node.root, node.db, node.enc, node.res, node.served, node.since

	// The objects the target stores in another version than the writer:
	// from the release data the tool itself judges by.
	versionStale := map[schema.GroupResource][]everyresource.Object{}
	for _, o := range res.Objects {
		gr := o.GVR.GroupResource()
		from, ok1 := release.StorageVersion(writerMinor, gr)
		to, ok2 := release.StorageVersion(targetMinor, gr)
		if ok1 && ok2 && from != to {
			versionStale[gr] = append(versionStale[gr], o)
		}
	}
	if len(versionStale) == 0 {
		// The test's premise: some object stale by its storage version, not
		// only by its key (1.35 to 1.36: VolumeAttributesClasses). After a
		// release bump, a pair of releases of which the later stores some
		// beta or GA resource in another version.
		t.Fatalf("the test's premise: no resource %s wrote is stored by %s in another version than by %s", writer, targetMinor, writerMinor)
	}

	writeK3sEncryption(t, enc, aescbcProvider("key2", 2), aescbcProvider("key1", 1))
	tool := []string{"--node-root", root, "--runtime-config", betaAPIs, "--target-version", targetMinor}
	rep, code := verifyJSON(t, tool)
	if code != verify.ExitStale || rep.Summary.Unreadable != 0 || rep.Summary.Stale < int64(len(res.Objects)) {
		t.Fatalf("verify --target-version %s after the key rotation: exit %d, %+v; want %d (stale), every object read, at least the %d written stale (key1)", targetMinor, code, rep.Summary, verify.ExitStale, len(res.Objects))
	}
	byVersion := staleBy(rep, reencode.ReasonVersion)
	t.Logf("stale by storage version for %s: %v", targetMinor, byVersion)
	for gr := range versionStale {
		if !slices.Contains(byVersion, gr.String()) {
			t.Errorf("verify --target-version %s: %s not stale by storage version (stale so: %v); %s stores it in another version than %s", targetMinor, gr, byVersion, writerMinor, targetMinor)
		}
	}

	if out, stderr, code := runTool(t, append([]string{"migrate"}, tool...)...); code != 0 {
		t.Fatalf("migrate --target-version %s on kine: exit %d\n%s%s", targetMinor, code, out, stderr)
	}
	writeK3sEncryption(t, enc, aescbcProvider("key2", 2))
	if rep, code := verifyJSON(t, tool); code != verify.ExitCurrent || rep.Summary.Stale != 0 || rep.Summary.Unreadable != 0 {
		t.Fatalf("verify --target-version %s with key2 alone after migrate on kine: exit %d, %+v; want %d, none stale or unreadable", targetMinor, code, rep.Summary, verify.ExitCurrent)
	}
	// Each version-stale object as stored now: the target's version, key2.
	for gr, objs := range versionStale {
		want, _ := release.StorageVersion(targetMinor, gr)
		for _, o := range objs {
			out, stderr, code := runTool(t, "inspect", "--node-root", root, "-o", "json", o.EtcdPath)
			var got struct {
				Storage struct{ APIVersion, KeyName string }
			}
			if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil {
				t.Errorf("inspect %s: exit %d, %v\n%s%s", o.EtcdPath, code, err, out, stderr)
				continue
			}
			if got.Storage.APIVersion != want.String() || got.Storage.KeyName != "key2" {
				t.Errorf("%s after migrate --target-version %s: stored as %s under %q, want %s under key2", o.EtcdPath, targetMinor, got.Storage.APIVersion, got.Storage.KeyName, want)
			}
		}
	}

	// The target release's own kube-apiserver, key2 alone.
	srv2, err := kinedb.Serve(ctx, kinedb.Config{Database: db, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	again := apiserverproc.Start(t, apiserverproc.Options{
		Binary:               olderAPIServer(t, target),
		EtcdURL:              srv2.Endpoint,
		RuntimeConfig:        betaAPIs,
		EncryptionConfigPath: enc,
	})
	defer again.Stop()
	checked := servesEvery(t, again.ClientConfig, target, "SQLite", res, served, since)
	var grs []string
	for gr, objs := range versionStale {
		if checked[gr] < len(objs) {
			t.Errorf("kube-apiserver %s: a no-op update of %d %s, %d written by %s stale by storage version: not every one checked", target, checked[gr], gr, len(objs), writer)
		}
		grs = append(grs, gr.String())
	}
	sort.Strings(grs)
	t.Logf("kube-apiserver %s on kine: every object of %v, stored by %s in another version, checked by a no-op update", target, grs, writer)
}
