package storagemigration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	tgt "kube-etcd-migrate/target"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/version"
	svmapi "k8s.io/kubernetes/pkg/apis/storagemigration"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/rollback"
)

const crdKey = "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com"

var (
	t0      = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	now     = time.Date(2026, 2, 3, 4, 5, 6, 0, time.UTC)
	widgets = schema.GroupResource{Group: "example.com", Resource: "widgets"}
)

// controllerRelease is a target release and what its kube-controller-manager writes
// on requests: 1.36 through storagemigration.k8s.io/v1beta1, 1.37 (GA)
// through v1, saying "Migration completed" when it succeeds.
type controllerRelease struct {
	target, api, succeeded string
}

var (
	r136 = controllerRelease{target: "1.36", api: "v1beta1"}
	r137 = controllerRelease{target: "1.37", api: "v1", succeeded: "Migration completed"}
)

// eachRelease runs f for the target releases 1.36 and 1.37.
func eachRelease(t *testing.T, f func(t *testing.T, r controllerRelease)) {
	for _, r := range []controllerRelease{r136, r137} {
		t.Run(r.target, func(t *testing.T) { f(t, r) })
	}
}

// servingAPI is kube-apiserver r's configuration with the API on (1.36:
// the feature gate and --runtime-config; 1.37: its defaults) or off (1.36:
// its defaults; 1.37: storagemigration.k8s.io/v1=false).
func servingAPI(t *testing.T, r controllerRelease, on bool) *apiserverconfig.Config {
	t.Helper()
	in := apiserverconfig.Input{TargetVersion: version.MustParse(r.target)}
	switch {
	case on && r == r136:
		in.FeatureGates = []string{"StorageVersionMigrator=true"}
		in.RuntimeConfig = []string{"storagemigration.k8s.io/v1beta1=true"}
	case !on && r == r137:
		in.RuntimeConfig = []string{"storagemigration.k8s.io/v1=false"}
	}
	api, err := apiserverconfig.Load(in)
	if err != nil {
		t.Fatal(err)
	}
	return api
}

// putRequest stores a request as kube-apiserver r created it (for kubectl
// create at r's version, whose field manager recorded the spec).
func putRequest(c *testcluster.Cluster, r controllerRelease, name string, created time.Time, gr schema.GroupResource, status svmapi.StorageVersionMigrationStatus) {
	c.Put("/registry/storageversionmigrations/"+name, GroupResource, &svmapi.StorageVersionMigration{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(created), ManagedFields: []metav1.ManagedFieldsEntry{{
			Manager: "kubectl-create", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "storagemigration.k8s.io/" + r.api, Time: &metav1.Time{Time: created},
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:resource":{"f:group":{},"f:resource":{}}}}`),
		}}},
		Spec:   svmapi.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: gr.Group, Resource: gr.Resource}},
		Status: status,
	}, r.target, "", "")
}

// putCRD stores widgets.example.com: v1beta1 and v1 (storage), objects
// stored in v1beta1 (storedVersions lists both), with the given status
// conditions and generation.
func putCRD(t *testing.T, c *testcluster.Cluster, generation int64, conds ...apiextensionsv1.CustomResourceDefinitionCondition) {
	t.Helper()
	props := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type:       "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}}}},
	}}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: "crd-uid", CreationTimestamp: metav1.NewTime(t0), Generation: generation},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group:      "example.com",
			Names:      apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope:      apiextensionsv1.NamespaceScoped,
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Schema: props},
				{Name: "v1", Served: true, Storage: true, Schema: props},
			},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1beta1", "v1"}, Conditions: conds},
	}
	internal := &apiextensions.CustomResourceDefinition{}
	if err := decode.ExtensionsScheme.Convert(crd, internal, nil); err != nil {
		t.Fatal(err)
	}
	c.Put(crdKey, decode.CRDGroupResource, internal, "", "", "")
	for i := 0; i < 3; i++ {
		data, _ := json.Marshal(map[string]any{
			"apiVersion": "example.com/v1beta1", "kind": "Widget",
			"metadata": map[string]any{"name": fmt.Sprintf("w%d", i), "namespace": "ns1", "uid": fmt.Sprintf("w-uid-%d", i), "creationTimestamp": "2026-01-02T03:04:05Z"},
			"spec":     map[string]any{"size": int64(i)},
		})
		c.PutRaw(fmt.Sprintf("/registry/example.com/widgets/ns1/w%d", i), append(data, '\n'))
	}
}

// storedRequest decodes a request as stored now.
func storedRequest(t *testing.T, c *testcluster.Cluster, env *pipeline.Env, name string) (*svmapi.StorageVersionMigration, int64) {
	t.Helper()
	obj, rev := testcluster.Stored(t, env, c, "/registry/storageversionmigrations/"+name)
	return obj.(*svmapi.StorageVersionMigration), rev
}

func storedCRD(t *testing.T, c *testcluster.Cluster, env *pipeline.Env) *apiextensions.CustomResourceDefinition {
	t.Helper()
	obj, _ := testcluster.Stored(t, env, c, crdKey)
	return obj.(*apiextensions.CustomResourceDefinition)
}

// finished are the conditions the controller leaves on a request it
// completed: Running turned False by the runner, then the outcome.
func finished(outcome svmapi.MigrationConditionType, reason, message string) []metav1.Condition {
	at := metav1.NewTime(now)
	return []metav1.Condition{
		{Type: "Running", Status: metav1.ConditionFalse, Reason: "MigrationCompleted", Message: "Migration completed", LastTransitionTime: at},
		{Type: string(outcome), Status: metav1.ConditionTrue, Reason: reason, Message: message, LastTransitionTime: at},
	}
}

func run(t *testing.T, env *pipeline.Env, o migrate.Options) *Result {
	t.Helper()
	o.AllowLiveAPIServer = true
	res, err := RunRequested(context.Background(), env, Options{Migrate: o, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatalf("RunRequested: %v (%+v)", err, res)
	}
	return res
}

func results(res *Result) []string {
	var out []string
	for _, o := range res.Requests {
		out = append(out, o.Name+"="+o.Result)
	}
	return out
}

// TestRequestsAsTheControllerLeavesThem: pending requests for secrets (two,
// after a key rotation), a CRD whose storage version moved, a resource that
// does not exist and one kube-apiserver does not store are carried out in
// the controller's order and left as kube-controller-manager of the target
// release leaves them (1.36 through v1beta1, 1.37 through v1); a finished request is not touched; a second run finds nothing to do.
func TestRequestsAsTheControllerLeavesThem(t *testing.T) {
	eachRelease(t, testRequestsAsTheControllerLeavesThem)
}

func testRequestsAsTheControllerLeavesThem(t *testing.T, r controllerRelease) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	for i := 0; i < 3; i++ {
		c.Put(fmt.Sprintf("/registry/secrets/ns1/s%d", i), testcluster.SecretsGR, testcluster.Secret("ns1", fmt.Sprintf("s%d", i), "pw"), "", "", oldCfg)
	}
	putCRD(t, c, 2)
	putRequest(c, r, "b-secrets", t0, testcluster.SecretsGR, svmapi.StorageVersionMigrationStatus{})
	putRequest(c, r, "a-secrets", t0, testcluster.SecretsGR, svmapi.StorageVersionMigrationStatus{})
	putRequest(c, r, "widgets", t0.Add(time.Second), widgets, svmapi.StorageVersionMigrationStatus{})
	putRequest(c, r, "ghosts", t0.Add(2*time.Second), schema.GroupResource{Group: "example.com", Resource: "ghosts"}, svmapi.StorageVersionMigrationStatus{})
	putRequest(c, r, "reviews", t0.Add(3*time.Second), schema.GroupResource{Group: "authentication.k8s.io", Resource: "tokenreviews"}, svmapi.StorageVersionMigrationStatus{})
	done := svmapi.StorageVersionMigrationStatus{ResourceVersion: "5", Conditions: finished(svmapi.MigrationSucceeded, "StorageVersionMigrationSucceeded", r.succeeded)}
	putRequest(c, r, "done", t0.Add(-time.Hour), testcluster.ConfigMapsGR, done)
	_, doneRev := storedRequest(t, c, c.Env(pipeline.Config{}), "done")

	env := c.Env(pipeline.Config{Target: tgt.Input{APIServer: servingAPI(t, r, true), EncryptionConfig: newCfg}})
	journal := c.Dir + "/journal"
	res := run(t, env, migrate.Options{PreflightOptions: guard.PreflightOptions{Journal: journal}})
	if got, want := results(res), []string{"a-secrets=Succeeded", "b-secrets=Succeeded", "widgets=Succeeded", "ghosts=Failed", "reviews=skipped"}; !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	if res.Finished != 1 {
		t.Errorf("finished %d, want 1", res.Finished)
	}
	if n := res.Requests[0].Migration.Summary.Rewritten; n != 3 {
		t.Errorf("a-secrets rewrote %d secrets, want 3", n)
	}
	if n := res.Requests[1].Migration.Summary.Rewritten; n != 0 {
		t.Errorf("b-secrets rewrote %d secrets after a-secrets, want 0", n)
	}
	for i := 0; i < 3; i++ {
		if v, _, _ := c.Get(fmt.Sprintf("/registry/secrets/ns1/s%d", i)); !bytes.HasPrefix(v, []byte("k8s:enc:aescbc:v1:key2:")) {
			t.Errorf("secret s%d not under key2", i)
		}
	}

	var rvs []int64
	for _, name := range []string{"a-secrets", "b-secrets", "widgets"} {
		svm, _ := storedRequest(t, c, env, name)
		if d := cmp.Diff(finished(svmapi.MigrationSucceeded, "StorageVersionMigrationSucceeded", r.succeeded), svm.Status.Conditions); d != "" {
			t.Errorf("%s: conditions (-controller +tool):\n%s", name, d)
		}
		rv, err := strconv.ParseInt(svm.Status.ResourceVersion, 10, 64)
		if err != nil {
			t.Errorf("%s: status.resourceVersion %q: %v", name, svm.Status.ResourceVersion, err)
		}
		rvs = append(rvs, rv)
		var entry *metav1.ManagedFieldsEntry
		for i, e := range svm.ManagedFields {
			if e.Manager == Manager {
				entry = &svm.ManagedFields[i]
			}
		}
		if entry == nil || entry.Subresource != "status" || entry.Operation != metav1.ManagedFieldsOperationUpdate || entry.APIVersion != "storagemigration.k8s.io/"+r.api ||
			!strings.Contains(entry.FieldsV1.GetRawString(), `"f:conditions"`) || !strings.Contains(entry.FieldsV1.GetRawString(), `"f:resourceVersion"`) {
			t.Errorf("%s: managedFields %+v: want the tool's status update recorded as kube-apiserver's field manager records it", name, svm.ManagedFields)
		}
		if created := map[string]time.Time{"a-secrets": t0, "b-secrets": t0, "widgets": t0.Add(time.Second)}[name]; svm.UID != types.UID("uid-"+name) || !svm.CreationTimestamp.Time.Equal(created) {
			t.Errorf("%s: metadata changed: %+v", name, svm.ObjectMeta)
		}
	}
	if !(rvs[0] < rvs[1]) {
		t.Errorf("status.resourceVersion a-secrets %d, b-secrets %d: b runs after a", rvs[0], rvs[1])
	}
	ghost, _ := storedRequest(t, c, env, "ghosts")
	if d := cmp.Diff(finished(svmapi.MigrationFailed, "StorageVersionMigrationFailed", "resource does not exist in discovery"), ghost.Status.Conditions); d != "" {
		t.Errorf("ghosts: conditions (-controller +tool):\n%s", d)
	}
	if ghost.Status.ResourceVersion != "" {
		t.Errorf("ghosts: status.resourceVersion %q, want none (the controller fails it before setting one)", ghost.Status.ResourceVersion)
	}
	reviews, _ := storedRequest(t, c, env, "reviews")
	if len(reviews.Status.Conditions) != 0 {
		t.Errorf("reviews: %+v, want left pending", reviews.Status)
	}
	if _, rev := storedRequest(t, c, env, "done"); rev != doneRev {
		t.Errorf("a finished request was rewritten")
	}

	crd := storedCRD(t, c, env)
	if !slices.Equal(crd.Status.StoredVersions, []string{"v1"}) {
		t.Errorf("CRD storedVersions %v, want [v1]", crd.Status.StoredVersions)
	}
	cond := apiextensions.FindCRDCondition(crd, crdConditionMigrating)
	want := &apiextensions.CustomResourceDefinitionCondition{Type: "StorageMigrating", Status: "False", Reason: "MigrationSucceeded", Message: "The migration has succeeded and the stored versions have been updated", ObservedGeneration: 2, LastTransitionTime: metav1.NewTime(now)}
	if d := cmp.Diff(want, cond); d != "" {
		t.Errorf("CRD StorageMigrating (-controller +tool):\n%s", d)
	}
	if crd.Generation != 2 || crd.UID != "crd-uid" {
		t.Errorf("CRD metadata changed: %+v", crd.ObjectMeta)
	}

	// Every write is journaled: a rollback puts the pending requests back.
	// A second run: nothing pending but the unsupported one, nothing written.
	rev := c.Revision()
	again := run(t, c.Env(pipeline.Config{Target: tgt.Input{APIServer: servingAPI(t, r, true), EncryptionConfig: newCfg}}), migrate.Options{})
	if got := results(again); !slices.Equal(got, []string{"reviews=skipped"}) || again.Finished != 5 {
		t.Errorf("second run: %v (finished %d)", got, again.Finished)
	}
	if c.Revision() != rev {
		t.Errorf("second run wrote (revision %d -> %d)", rev, c.Revision())
	}
	rb, err := rollback.Rollback(context.Background(), c.Cli, journal, &etcdscan.Writer{Client: c.Cli})
	if err != nil || rb.Failed != 0 || rb.Skipped != 0 {
		t.Fatalf("rollback: %+v %v", rb, err)
	}
	if svm, _ := storedRequest(t, c, env, "a-secrets"); len(svm.Status.Conditions) != 0 {
		t.Errorf("after rollback a-secrets has %+v", svm.Status.Conditions)
	}
}

// TestRunningRequestGenerationAndUnreadable: a request kube-controller-manager
// had started (Running, status.resourceVersion set, the CRD's StorageMigrating
// observing generation 1) for a CRD whose spec changed since (generation 2):
// the tool finishes it, keeps the controller's status.resourceVersion, and,
// as the controller, leaves storedVersions alone on the generation mismatch.
// A request for a resource with an object no configured key decrypts is
// Failed with the controller's reason and a message naming the key, and that
// object is left untouched.
func TestRunningRequestGenerationAndUnreadable(t *testing.T) {
	eachRelease(t, testRunningRequestGenerationAndUnreadable)
}

func testRunningRequestGenerationAndUnreadable(t *testing.T, r controllerRelease) {
	c := testcluster.New(t, testetcd.Options{})
	lost := c.EncryptionConfig("lost.yaml", testcluster.AESCBC("key9", 9))
	cfg := c.EncryptionConfig("cfg.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	putCRD(t, c, 2, apiextensionsv1.CustomResourceDefinitionCondition{
		Type: apiextensionsv1.StorageMigrating, Status: apiextensionsv1.ConditionTrue, Reason: "MigrationRunning",
		Message: "Migration widgets is running", ObservedGeneration: 1, LastTransitionTime: metav1.NewTime(t0),
	})
	running := svmapi.StorageVersionMigrationStatus{ResourceVersion: "7", Conditions: []metav1.Condition{
		{Type: "Running", Status: metav1.ConditionTrue, Reason: "MigrationRunning", Message: "The migration is running", LastTransitionTime: metav1.NewTime(t0)},
	}}
	putRequest(c, r, "widgets", t0, widgets, running)
	c.Put("/registry/configmaps/ns1/lost", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "lost"), "", "", lost)
	c.Put("/registry/configmaps/ns1/fine", testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", "fine"), "", "", "")
	putRequest(c, r, "configmaps", t0.Add(time.Second), testcluster.ConfigMapsGR, svmapi.StorageVersionMigrationStatus{})
	lostValue, lostRev, _ := c.Get("/registry/configmaps/ns1/lost")

	env := c.Env(pipeline.Config{Target: tgt.Input{APIServer: servingAPI(t, r, true), EncryptionConfig: cfg}})
	res := run(t, env, migrate.Options{})
	if got, want := results(res), []string{"widgets=Succeeded", "configmaps=Failed"}; !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	w, _ := storedRequest(t, c, env, "widgets")
	wantConds := []metav1.Condition{
		{Type: "Running", Status: metav1.ConditionFalse, Reason: "MigrationCompleted", Message: "Migration completed", LastTransitionTime: metav1.NewTime(now)},
		{Type: "Succeeded", Status: metav1.ConditionTrue, Reason: "StorageVersionMigrationSucceeded", Message: r.succeeded, LastTransitionTime: metav1.NewTime(now)},
	}
	if d := cmp.Diff(wantConds, w.Status.Conditions); d != "" || w.Status.ResourceVersion != "7" {
		t.Errorf("widgets: resourceVersion %q (want the controller's 7), conditions (-want +got):\n%s", w.Status.ResourceVersion, d)
	}
	crd := storedCRD(t, c, env)
	if !slices.Equal(crd.Status.StoredVersions, []string{"v1beta1", "v1"}) {
		t.Errorf("storedVersions %v trimmed despite the generation mismatch", crd.Status.StoredVersions)
	}
	if cond := apiextensions.FindCRDCondition(crd, crdConditionMigrating); cond == nil || cond.Status != "False" || cond.Reason != "MigrationSucceeded" ||
		cond.Message != "The migration has succeeded but the stored versions have not been updated due to a generation mismatch" || cond.ObservedGeneration != 2 {
		t.Errorf("StorageMigrating %+v", cond)
	}
	if v, _, _ := c.Get("/registry/example.com/widgets/ns1/w0"); !bytes.Contains(v, []byte(`"apiVersion":"example.com/v1"`)) {
		t.Errorf("w0 not migrated: %s", v)
	}

	// 1.37's controller counts what it could not migrate: 1 of the 2.
	cm, _ := storedRequest(t, c, env, "configmaps")
	failed := condition(cm.Status.Conditions, "Failed")
	prefix := map[controllerRelease]string{r137: "1/2 not yet migrated. "}[r]
	if failed == nil || failed.Reason != "StorageVersionMigrationFailed" ||
		!strings.HasPrefix(failed.Message, prefix+"migration encountered unhandled error: 1 object(s) could not be read and were left untouched, first /registry/configmaps/ns1/lost: undecryptable") ||
		!strings.Contains(failed.Message, "key9") {
		t.Errorf("configmaps Failed condition %+v", failed)
	}
	if v, rev, _ := c.Get("/registry/configmaps/ns1/lost"); rev != lostRev || !bytes.Equal(v, lostValue) {
		t.Errorf("the undecryptable configmap was written")
	}
}

func condition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// TestNotServedAndRecord: with kube-apiserver's defaults (gate off, API not
// enabled) --requested and --record refuse and write nothing; with the API
// on, a record of a migration is created as kube-apiserver creates an
// object, finished, and named after the tool and the start time.
func TestNotServedAndRecord(t *testing.T) { eachRelease(t, testNotServedAndRecord) }

func testNotServedAndRecord(t *testing.T, r controllerRelease) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1))
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1))
	c.Put("/registry/secrets/ns1/s", testcluster.SecretsGR, testcluster.Secret("ns1", "s", "pw"), "", "", oldCfg)
	putRequest(c, r, "secrets", t0, testcluster.SecretsGR, svmapi.StorageVersionMigrationStatus{})
	rev := c.Revision()

	off := c.Env(pipeline.Config{Target: tgt.Input{APIServer: servingAPI(t, r, false), EncryptionConfig: newCfg}})
	_, err := RunRequested(context.Background(), off, Options{Migrate: migrate.Options{PreflightOptions: guard.PreflightOptions{AllowLiveAPIServer: true}}})
	// 1.36 by default: the gate and the API off; 1.37: the API turned off.
	if err == nil {
		t.Fatal("--requested without the API: no error")
	}
	if gateOff := strings.Contains(err.Error(), "StorageVersionMigrator feature gate is off"); gateOff != (r == r136) || !strings.Contains(err.Error(), "--runtime-config=storagemigration.k8s.io/"+r.api+"=true") || !strings.Contains(err.Error(), "nothing was written") {
		t.Errorf("--requested without the API: %v", err)
	}
	if _, err := Record(context.Background(), off, &migrate.Summary{Resources: []migrate.ResourceSummary{{Resource: "secrets", Counts: migrate.Counts{Rewritten: 1}}}}, t0, migrate.Options{}, nil); err == nil || !strings.Contains(err.Error(), "no record was written") {
		t.Errorf("Record without the API: %v", err)
	}
	if c.Revision() != rev {
		t.Fatalf("refusals wrote (revision %d -> %d)", rev, c.Revision())
	}

	on := c.Env(pipeline.Config{Target: tgt.Input{APIServer: servingAPI(t, r, true), EncryptionConfig: newCfg}, Resources: []string{"secrets"}})
	sum, err := migrate.Run(context.Background(), on, migrate.Options{PreflightOptions: guard.PreflightOptions{AllowLiveAPIServer: true}})
	if err != nil || sum.Summary.Rewritten != 1 {
		t.Fatalf("migrate: %v %+v", err, sum.Summary)
	}
	recs, err := Record(context.Background(), on, sum, t0, migrate.Options{}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	name := "kube-etcd-migrate-20260102-030405-secrets"
	if len(recs) != 1 || recs[0].Name != name || recs[0].Result != ResultSucceeded {
		t.Fatalf("records %+v", recs)
	}
	svm, _ := storedRequest(t, c, on, name)
	// Stored as both releases' kube-apiserver store it: v1beta1 (1.37's
	// storage factory keeps it for one release after v1).
	value, modRev, _ := c.Get("/registry/storageversionmigrations/" + name)
	if obj, err := on.Decoder.Decode(context.Background(), etcdscan.KV{Key: "/registry/storageversionmigrations/" + name, Value: value, ModRevision: modRev}); err != nil {
		t.Error(err)
	} else if obj.StoredGVK.Version != "v1beta1" {
		t.Errorf("record stored as %v, want storagemigration.k8s.io/v1beta1", obj.StoredGVK)
	}
	if svm.UID == "" || svm.CreationTimestamp.IsZero() || svm.Labels[ManagedByLabel] != Manager || svm.Spec.Resource != (metav1.GroupResource{Resource: "secrets"}) {
		t.Errorf("record metadata/spec %+v %+v", svm.ObjectMeta, svm.Spec)
	}
	if d := cmp.Diff(finished(svmapi.MigrationSucceeded, "StorageVersionMigrationSucceeded", r.succeeded), svm.Status.Conditions); d != "" {
		t.Errorf("record conditions (-controller +tool):\n%s", d)
	}
	if svm.Status.ResourceVersion != strconv.FormatInt(sum.Revision, 10) {
		t.Errorf("record status.resourceVersion %q, want the scan revision %d", svm.Status.ResourceVersion, sum.Revision)
	}
	var subs []string
	for _, e := range svm.ManagedFields {
		subs = append(subs, e.Manager+"/"+e.Subresource+"@"+e.APIVersion)
	}
	at := "@storagemigration.k8s.io/" + r.api
	if !slices.Equal(subs, []string{"kube-etcd-migrate/" + at, "kube-etcd-migrate/status" + at}) {
		t.Errorf("record managedFields %v: want the create and the status update", subs)
	}
	// The same name again: a conflict, nothing overwritten.
	before, rev2, _ := c.Get("/registry/storageversionmigrations/" + name)
	recs, err = Record(context.Background(), on, sum, t0, migrate.Options{}, nil)
	if err != nil || len(recs) != 1 || recs[0].Result != "exists" {
		t.Fatalf("second record: %+v %v", recs, err)
	}
	if after, rev3, _ := c.Get("/registry/storageversionmigrations/" + name); rev3 != rev2 || !bytes.Equal(after, before) {
		t.Errorf("an existing record was overwritten")
	}
	// The pending request was not touched by --record.
	if p, _ := storedRequest(t, c, on, "secrets"); len(p.Status.Conditions) != 0 {
		t.Errorf("pending request changed: %+v", p.Status)
	}
}

// TestConflictReported: a request changed by someone else after the tool
// read it is reported as a conflict and left as they wrote it: the tool's
// compare-and-swap fails and it does not retry.
func TestConflictReported(t *testing.T) {
	r := r137
	c := testcluster.New(t, testetcd.Options{})
	putRequest(c, r, "ghosts", t0, schema.GroupResource{Group: "example.com", Resource: "ghosts"}, svmapi.StorageVersionMigrationStatus{})
	env := c.Env(pipeline.Config{Target: tgt.Input{APIServer: servingAPI(t, r, true)}})
	wr, err := newWriter(env, migrate.Options{}, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := "/registry/storageversionmigrations/ghosts"
	cur, err := wr.get(ctx, key)
	if err != nil || cur == nil {
		t.Fatalf("get: %v %v", cur, err)
	}
	// Someone else (kube-controller-manager) finishes it meanwhile.
	theirs := finished(svmapi.MigrationFailed, "StorageVersionMigrationFailed", "resource does not exist in discovery")
	putRequest(c, r, "ghosts", t0, schema.GroupResource{Group: "example.com", Resource: "ghosts"}, svmapi.StorageVersionMigrationStatus{Conditions: theirs})
	value, rev, _ := c.Get(key)

	old := cur.obj.(*svmapi.StorageVersionMigration)
	upd := old.DeepCopy()
	setCondition(upd, svmapi.MigrationRunning, reasonRunning, messageRunning, metav1.NewTime(now))
	out, err := wr.finish(ctx, Outcome{Name: "ghosts"}, cur, old, upd, ResultFailed)
	if err != nil || out.Result != ResultConflict || !strings.Contains(out.Message, "someone else") {
		t.Fatalf("outcome %+v, err %v: want a conflict", out, err)
	}
	if v, r, _ := c.Get(key); r != rev || !bytes.Equal(v, value) {
		t.Errorf("the other writer's request was overwritten")
	}
}

// TestOlderControllersRefused: for a 1.35 or 1.34 target, whose
// kube-controller-manager writes other conditions (1.35: a Running
// condition first) or another API version (1.34: v1alpha1), the tool
// refuses to carry out requests or record a migration, writing nothing;
// 1.36 and 1.37 are what it writes.
func TestOlderControllersRefused(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	putRequest(c, r136, "secrets", t0, testcluster.SecretsGR, svmapi.StorageVersionMigrationStatus{})
	rev := c.Revision()
	for _, target := range []string{"1.34", "1.35", "1.36", "1.37"} {
		in := apiserverconfig.Input{TargetVersion: version.MustParse(target), FeatureGates: []string{"StorageVersionMigrator=true"}, RuntimeConfig: []string{"storagemigration.k8s.io/v1beta1=true"}}
		if target == "1.34" {
			// 1.34 served v1alpha1 only, which these 1.37 types no longer
			// have: the tool cannot serve the requests at all.
			in.RuntimeConfig = nil
		}
		api, err := apiserverconfig.Load(in)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		env := c.Env(pipeline.Config{Target: tgt.Input{APIServer: api}})
		err = Writable(env)
		if refused := target == "1.34" || target == "1.35"; refused != (err != nil) {
			t.Errorf("target %s: Writable = %v", target, err)
		} else if refused && !strings.Contains(err.Error(), "requests for a "+target+" target") {
			t.Errorf("target %s: %v", target, err)
		}
		if err == nil {
			continue
		}
		if _, err := RunRequested(context.Background(), env, Options{Migrate: migrate.Options{PreflightOptions: guard.PreflightOptions{AllowLiveAPIServer: true}}}); err == nil || (target == "1.35" && !strings.Contains(err.Error(), "kube-controller-manager 1.36 and 1.37")) {
			t.Errorf("target %s: --requested: %v", target, err)
		}
		if _, err := Record(context.Background(), env, &migrate.Summary{Resources: []migrate.ResourceSummary{{Resource: "secrets", Counts: migrate.Counts{Rewritten: 1}}}}, t0, migrate.Options{}, nil); err == nil {
			t.Errorf("target %s: Record wrote", target)
		}
	}
	if c.Revision() != rev {
		t.Fatalf("refusals wrote (revision %d -> %d)", rev, c.Revision())
	}
}
