package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/storagemigration"
)

// TestStorageVersionMigrationRequests: kube-apiserver 1.37 serving
// storagemigration.k8s.io/v1 (GA, on by default) gets requests
// for secrets (twice, after a key rotation), for a CRD whose storage version
// moved and for a resource that does not exist; kube-controller-manager is
// not running, so they stay pending. With kube-apiserver stopped, --record
// for a kube-apiserver with the API turned off refuses and writes nothing; verify lists the requests and
// what each would rewrite; migrate --requested carries them out; migrate
// --record migrates the rest (configmaps) and records it. kube-apiserver
// started again with the same flags then serves the requests Succeeded /
// Failed exactly as 1.37's controller leaves them (through v1, the tool's
// managedFields entries at v1), the record finished, the
// CRD's storedVersions trimmed, the secrets under the new key, and a no-op
// update of every object (the requests included) writes nothing.
func TestStorageVersionMigrationRequests(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	const group = "svm.example.com"
	resources := []string{"secrets", "configmaps"}
	enc := c.writeEncryptionConfig("encryption.yaml", resources, aescbcProvider("key1", 1), identityProvider)
	opts := apiservertest.Options{EncryptionConfigPath: enc, PriorityAndFairness: true}

	rc := c.start(opts)
	cs := kubernetes.NewForConfigOrDie(rc)
	ext := apiextensionsclient.NewForConfigOrDie(rc)
	dyn := dynamic.NewForConfigOrDie(rc)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := cs.CoreV1().Secrets("app").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db-" + strconv.Itoa(i)}, Data: secretData(i)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ConfigMaps("app").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg-" + strconv.Itoa(i)}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A CRD whose storage version moves from v1beta1 to v1 after objects were written.
	props := map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}}
	crd := twoVersionCRD(group, "widgets", "Widget", props, props, &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter})
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRD(t, ext, crd.Name, "established", established)
	beta := schema.GroupVersionResource{Group: group, Version: "v1beta1", Resource: "widgets"}
	for i := 0; i < 3; i++ {
		createCR(t, dyn, beta, "Widget", "app", "w"+strconv.Itoa(i), map[string]any{"size": int64(i)})
	}
	got, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Versions[0].Storage, got.Spec.Versions[1].Storage = false, true
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRD(t, ext, crd.Name, "recorded v1", func(c *apiextensionsv1.CustomResourceDefinition) bool {
		return slices.Equal(c.Status.StoredVersions, []string{"v1beta1", "v1"})
	})
	// The requests, as an operator creates them.
	svms := cs.StoragemigrationV1().StorageVersionMigrations()
	requests := map[string]metav1.GroupResource{
		"secrets-1": {Resource: "secrets"},
		"secrets-2": {Resource: "secrets"},
		"widgets":   {Group: group, Resource: "widgets"},
		"ghosts":    {Group: group, Resource: "ghosts"},
	}
	for _, name := range []string{"secrets-1", "secrets-2", "widgets", "ghosts"} {
		if _, err := svms.Create(ctx, &svmv1.StorageVersionMigration{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: svmv1.StorageVersionMigrationSpec{Resource: requests[name]}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create request %s: %v", name, err)
		}
	}
	c.stop()

	// Key rotation: key2 first, key1 still there to read.
	c.writeEncryptionConfig("encryption.yaml", resources, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	etcd := []string{"--endpoints", c.etcd.Endpoint, "--encryption-provider-config", enc}
	api := []string{"--target-version", "1.37"}
	tool := func(args ...string) (string, string, int) {
		t.Helper()
		return runTool(t, append(args, etcd...)...)
	}
	revision := func() int64 {
		t.Helper()
		r, err := c.etcd.Revision(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}

	// 1. --record where kube-apiserver would not serve the records: refused.
	rev := revision()
	if _, stderr, code := tool(append([]string{"migrate", "--record", "--allow-live-apiserver", "--runtime-config", "storagemigration.k8s.io/v1=false"}, api...)...); code != 1 ||
		!strings.Contains(stderr, "storagemigration.k8s.io/v1 is not served") || !strings.Contains(stderr, "nothing was written") {
		t.Errorf("migrate --record without the API: exit %d, stderr %q; want 1 and why", code, stderr)
	}
	if r := revision(); r != rev {
		t.Fatalf("the refused --record wrote (revision %d -> %d)", rev, r)
	}

	// 2. verify lists the pending requests and what each would rewrite.
	out, stderr, code := tool(append([]string{"verify", "-o", "json"}, api...)...)
	if code != 3 {
		t.Fatalf("verify: exit %d, want 3 (stale)\n%s", code, stderr)
	}
	var rep struct {
		Requests *storagemigration.Plan `json:"storageVersionMigrations"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Requests == nil {
		t.Fatalf("verify -o json: %v, no storageVersionMigrations\n%s", err, out)
	}
	plan := map[string]storagemigration.PlannedRequest{}
	for _, p := range rep.Requests.Pending {
		plan[p.Name] = p
	}
	if !rep.Requests.Served || len(plan) != 4 {
		t.Fatalf("verify lists %+v, want the 4 pending requests, API served", rep.Requests)
	}
	if p := plan["secrets-1"]; p.Action != "migrate" || p.Stale != 3 || p.StaleBy["encryption"] != 3 {
		t.Errorf("secrets-1: %+v, want migrate 3 secrets stale by encryption", p)
	}
	if p := plan["secrets-2"]; p.Action != "migrate" || p.After != "secrets-1" {
		t.Errorf("secrets-2: %+v, want after secrets-1", p)
	}
	if p := plan["widgets"]; p.Action != "migrate" || p.Stale != 3 || p.CRD == nil || p.CRD.StorageVersion != "v1" {
		t.Errorf("widgets: %+v, want 3 stale and the CRD", p)
	}
	if p := plan["ghosts"]; p.Action != "fail" || p.Message != "resource does not exist in discovery" {
		t.Errorf("ghosts: %+v, want the controller's failure", p)
	}
	out, _, _ = tool(append([]string{"verify"}, api...)...)
	if !strings.Contains(out, "StorageVersionMigration requests: 4 pending, 0 finished") || !strings.Contains(out, "then storedVersions [v1beta1,v1] -> [v1]") {
		t.Errorf("verify's table lacks the requests:\n%s", out)
	}

	// 3. migrate --requested: a dry run writes nothing, then the requests.
	if out, stderr, code := tool(append([]string{"migrate", "--requested", "--dry-run"}, api...)...); code != 0 || !strings.Contains(out, "would-succeed") {
		t.Fatalf("migrate --requested --dry-run: exit %d\n%s\n%s", code, out, stderr)
	}
	if r := revision(); r != rev {
		t.Fatalf("the dry run wrote (revision %d -> %d)", rev, r)
	}
	metricsFile := filepath.Join(c.dir, "requested.prom")
	out, stderr, code = tool(append([]string{"migrate", "--requested", "--allow-live-apiserver", "--journal", filepath.Join(c.dir, "journal"), "--metrics-file", metricsFile, "-o", "json"}, api...)...)
	if code != 0 {
		t.Fatalf("migrate --requested: exit %d\n%s\n%s", code, out, stderr)
	}
	if m, err := os.ReadFile(metricsFile); err != nil || !strings.Contains(string(m), `storage_migrator_core_migrator_migrated_objects{resource="secrets"} 3`) ||
		!strings.Contains(string(m), `storage_migrator_core_migrator_migrated_objects{resource="widgets.svm.example.com"} 3`) {
		t.Errorf("--metrics-file of --requested: %v\n%s", err, m)
	}
	var res storagemigration.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("migrate --requested -o json: %v\n%s", err, out)
	}
	results := map[string]string{}
	for _, o := range res.Requests {
		results[o.Name] = o.Result
	}
	if want := map[string]string{"secrets-1": "Succeeded", "secrets-2": "Succeeded", "widgets": "Succeeded", "ghosts": "Failed"}; !maps.Equal(results, want) {
		t.Fatalf("migrate --requested: %v, want %v", results, want)
	}
	assertPrefix(t, c, "/registry/secrets/app/db-0", "k8s:enc:aescbc:v1:key2:")
	assertPrefix(t, c, "/registry/configmaps/app/cfg-0", "k8s:enc:aescbc:v1:key1:") // not requested

	// 4. migrate --record: the configmaps (not requested) and a record of it.
	out, stderr, code = tool(append([]string{"migrate", "--record", "--allow-live-apiserver", "-o", "json"}, api...)...)
	if code != 0 {
		t.Fatalf("migrate --record: exit %d\n%s\n%s", code, out, stderr)
	}
	var recorded struct {
		Records []storagemigration.Recorded `json:"records"`
	}
	if err := json.Unmarshal([]byte(out), &recorded); err != nil {
		t.Fatalf("migrate --record -o json: %v\n%s", err, out)
	}
	record := ""
	for _, r := range recorded.Records {
		if r.Result != "Succeeded" {
			t.Errorf("record %+v", r)
		}
		if r.Resource == "configmaps" && r.Group == "" {
			record = r.Name
		}
	}
	if !strings.HasPrefix(record, "kube-etcd-migrate-") || !strings.HasSuffix(record, "-configmaps") {
		t.Fatalf("records %+v: none for configmaps", recorded.Records)
	}
	assertPrefix(t, c, "/registry/configmaps/app/cfg-0", "k8s:enc:aescbc:v1:key2:")
	// inventory and inspect show the requests like any object.
	if out, stderr, code := tool("inspect", "/registry/storageversionmigrations/secrets-1", "-o", "json"); code != 0 || !strings.Contains(out, "StorageVersionMigrationSucceeded") {
		t.Errorf("inspect a request: exit %d\n%s\n%s", code, out, stderr)
	}
	if out, stderr, code := tool("inventory"); code != 0 || !strings.Contains(out, "storageversionmigrations.storagemigration.k8s.io") {
		t.Errorf("inventory: exit %d, no storageversionmigrations\n%s\n%s", code, out, stderr)
	}

	// 5. kube-apiserver with the same flags: the requests as the controller leaves them.
	rc = c.start(opts)
	cs = kubernetes.NewForConfigOrDie(rc)
	ext = apiextensionsclient.NewForConfigOrDie(rc)
	svms = cs.StoragemigrationV1().StorageVersionMigrations()
	type cond struct{ Type, Status, Reason, Message string }
	completed := cond{"Running", "False", "MigrationCompleted", "Migration completed"}
	succeeded := cond{"Succeeded", "True", "StorageVersionMigrationSucceeded", "Migration completed"}
	want := map[string][]cond{
		"secrets-1": {completed, succeeded},
		"secrets-2": {completed, succeeded},
		"widgets":   {completed, succeeded},
		"ghosts":    {completed, {"Failed", "True", "StorageVersionMigrationFailed", "resource does not exist in discovery"}},
		record:      {completed, succeeded},
	}
	rvs := map[string]int64{}
	for name, conds := range want {
		svm, err := svms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("request %s: %v", name, err)
			continue
		}
		var gotConds []cond
		for _, sc := range svm.Status.Conditions {
			gotConds = append(gotConds, cond{sc.Type, string(sc.Status), sc.Reason, sc.Message})
			if sc.LastTransitionTime.IsZero() || sc.ObservedGeneration != svm.Generation && sc.Type == "Running" {
				t.Errorf("request %s: condition %+v: want lastTransitionTime set and observedGeneration %d", name, sc, svm.Generation)
			}
		}
		if !slices.Equal(gotConds, conds) {
			t.Errorf("request %s: conditions %+v, want %+v", name, gotConds, conds)
		}
		for _, e := range svm.ManagedFields {
			if e.Manager == storagemigration.Manager && e.APIVersion != "storagemigration.k8s.io/v1" {
				t.Errorf("request %s: the tool's managedFields entry %+v: want storagemigration.k8s.io/v1, what 1.37's clients write", name, e)
			}
		}
		if name == "ghosts" {
			if svm.Status.ResourceVersion != "" {
				t.Errorf("ghosts: status.resourceVersion %q, want none", svm.Status.ResourceVersion)
			}
			continue
		}
		rvs[name], err = strconv.ParseInt(svm.Status.ResourceVersion, 10, 64)
		if err != nil || rvs[name] <= 0 {
			t.Errorf("request %s: status.resourceVersion %q", name, svm.Status.ResourceVersion)
		}
	}
	if rvs["secrets-1"] >= rvs["secrets-2"] {
		t.Errorf("status.resourceVersion secrets-1 %d, secrets-2 %d: the second runs after the first", rvs["secrets-1"], rvs["secrets-2"])
	}
	if svm, err := svms.Get(ctx, record, metav1.GetOptions{}); err == nil && (svm.Spec.Resource != metav1.GroupResource{Resource: "configmaps"} || svm.UID == "" || svm.Labels[storagemigration.ManagedByLabel] != storagemigration.Manager) {
		t.Errorf("record %s: %+v", record, svm)
	}
	crdNow := waitCRD(t, ext, crd.Name, "established", established)
	if !slices.Equal(crdNow.Status.StoredVersions, []string{"v1"}) {
		t.Errorf("CRD storedVersions %v, want [v1]", crdNow.Status.StoredVersions)
	}
	var migrating *apiextensionsv1.CustomResourceDefinitionCondition
	for i := range crdNow.Status.Conditions {
		if crdNow.Status.Conditions[i].Type == apiextensionsv1.StorageMigrating {
			migrating = &crdNow.Status.Conditions[i]
		}
	}
	if migrating == nil || migrating.Status != apiextensionsv1.ConditionFalse || migrating.Reason != "MigrationSucceeded" ||
		migrating.Message != "The migration has succeeded and the stored versions have been updated" || migrating.ObservedGeneration != crdNow.Generation {
		t.Errorf("CRD StorageMigrating %+v (generation %d)", migrating, crdNow.Generation)
	}
	t.Logf("no-op update of %d objects", noOpUpdates(t, rc))
}

func assertPrefix(t *testing.T, c *cluster, key, prefix string) {
	t.Helper()
	if v, _, _ := etcdValue(t, c.cli, key); !bytes.HasPrefix(v, []byte(prefix)) {
		t.Errorf("%s does not start with %q", key, prefix)
	}
}
