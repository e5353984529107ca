package command

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/inventory"
	"kube-etcd-migrate/pipeline"
)

// inspect is the inspect command's path: the key inspected, then printed
// as format when there is something to print, then the error.
func inspect(env *pipeline.Env, key string, showSecrets bool, format string, w io.Writer) error {
	o, err := inventory.Inspect(context.Background(), env, key, showSecrets)
	if o != nil {
		if werr := writeInspected(w, o, format); werr != nil {
			return werr
		}
	}
	return err
}

// TestInventoryTable: the table names every resource, the unreadable keys
// and the not-object key, and never a secret value.
func TestInventoryTable(t *testing.T) {
	c := testcluster.NewMixed(t)
	c.Seed()
	inv, err := inventory.Run(context.Background(), c.MixedEnv(), inventory.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	oldVersion := testcluster.StorageVersion(t, "1.34", testcluster.DeviceClassGR)
	var out bytes.Buffer
	if err := printReport(&out, "table", inventoryReport{inv}); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	for _, want := range []string{"secrets", "aescbc:key1=2", "deviceclasses.resource.k8s.io",
		oldVersion + "=1", "/registry/configmaps/default/truncated", "/registry/configmaps/default/garbage", "/registry/secrets/default/lost", "undecryptable",
		"Keys that are not API objects (1)", "/registry/health", "Orphaned keys (1;", "crd-missing", "/registry/example.com/widgets/default/w1"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, testcluster.MixedPassword) {
		t.Error("table shows a secret value")
	}
}

func TestInventoryJSON(t *testing.T) {
	c := testcluster.NewMixed(t)
	c.Seed()
	inv, err := inventory.Run(context.Background(), c.MixedEnv(), inventory.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := printReport(&out, "json", inventoryReport{inv}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Revision   *int64 `json:"revision"`
		Consistent *bool  `json:"consistent"`
		Resources  []struct {
			Group      *string          `json:"group"`
			Resource   string           `json:"resource"`
			Count      *int64           `json:"count"`
			Bytes      *int64           `json:"bytes"`
			Versions   map[string]int64 `json:"versions"`
			MediaTypes map[string]int64 `json:"mediaTypes"`
			Encryption map[string]int64 `json:"encryption"`
			WithLease  int64            `json:"withLease"`
		} `json:"resources"`
		NotObjects []struct {
			Key string `json:"key"`
		} `json:"notObjects"`
	}
	if err := json.Unmarshal(out.Bytes(), &doc); err != nil {
		t.Fatalf("inventory JSON: %v\n%s", err, out.String())
	}
	if doc.Revision == nil || *doc.Revision != inv.Revision || doc.Consistent == nil || !*doc.Consistent {
		t.Errorf("revision/consistent missing or wrong:\n%s", out.String())
	}
	byName := map[string]int{}
	for i, r := range doc.Resources {
		if r.Group == nil || r.Count == nil || r.Bytes == nil {
			t.Errorf("resource %s lacks group, count or bytes", r.Resource)
			continue
		}
		byName[*r.Group+"/"+r.Resource] = i
	}
	ev, ok := byName["/events"]
	if !ok || *doc.Resources[ev].Count != 2 || doc.Resources[ev].WithLease != 2 || doc.Resources[ev].Versions["v1"] != 2 {
		t.Errorf("events entry wrong or missing:\n%s", out.String())
	}
	dc, ok := byName["resource.k8s.io/deviceclasses"]
	if !ok || *doc.Resources[dc].Count != 2 || *doc.Resources[dc].Bytes <= 0 {
		t.Errorf("deviceclasses entry wrong or missing:\n%s", out.String())
	}
	sec := byName["/secrets"]
	if doc.Resources[sec].Encryption["aescbc:key1"] != 2 {
		t.Errorf("secrets encryption %v", doc.Resources[sec].Encryption)
	}
	if len(doc.NotObjects) != 1 || doc.NotObjects[0].Key != "/registry/health" {
		t.Errorf("notObjects %+v", doc.NotObjects)
	}
	if strings.Contains(out.String(), testcluster.MixedPassword) {
		t.Error("JSON shows a secret value")
	}
}

func TestInspectRedactsSecrets(t *testing.T) {
	c := testcluster.NewMixed(t)
	c.Seed()
	env := c.MixedEnv()
	const key = "/registry/secrets/default/db"
	b64 := base64.StdEncoding.EncodeToString([]byte(testcluster.MixedPassword))

	var out bytes.Buffer
	if err := inspect(env, key, false, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"# key:", key, "aescbc, key key1", "v1 Secret", "<redacted 20 bytes>", "<redacted 5 bytes>", "team: db", "kind: Secret", "apiVersion: v1"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, testcluster.MixedPassword) || strings.Contains(text, b64) {
		t.Errorf("inspect printed the secret value without --show-secrets:\n%s", text)
	}
	// The object part is valid YAML of the v1 Secret with redacted values.
	_, doc, _ := strings.Cut(text, "---\n")
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
		t.Fatalf("object is not YAML: %v", err)
	}
	data, _ := obj["data"].(map[string]any)
	if data["password"] != "<redacted 20 bytes>" {
		t.Errorf("data.password = %v", data["password"])
	}

	out.Reset()
	if err := inspect(env, key, true, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "password: "+b64) {
		t.Errorf("--show-secrets does not show data.password:\n%s", out.String())
	}

	out.Reset()
	if err := inspect(env, key, false, "json", &out); err != nil {
		t.Fatal(err)
	}
	var j struct {
		Storage inventory.Header `json:"storage"`
		Object  map[string]any   `json:"object"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		t.Fatalf("inspect JSON: %v\n%s", err, out.String())
	}
	if j.Storage.Provider != "aescbc" || j.Storage.KeyName != "key1" || j.Storage.Kind != "Secret" || j.Storage.APIVersion != "v1" || j.Storage.Size == 0 || j.Storage.ModRevision == 0 {
		t.Errorf("storage header %+v", j.Storage)
	}
	if strings.Contains(out.String(), testcluster.MixedPassword) || strings.Contains(out.String(), b64) {
		t.Error("inspect JSON printed the secret value")
	}
	md, _ := j.Object["metadata"].(map[string]any)
	if md["name"] != "db" || md["resourceVersion"] != fmt.Sprint(j.Storage.ModRevision) {
		t.Errorf("metadata %v", md)
	}
}

func TestInspectStoredVersionAndLease(t *testing.T) {
	c := testcluster.NewMixed(t)
	lease := c.Seed()
	env := c.MixedEnv()

	var out bytes.Buffer
	if err := inspect(env, "/registry/deviceclasses/old-gpu", false, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	old := testcluster.StorageVersion(t, "1.34", testcluster.DeviceClassGR)
	if !strings.Contains(out.String(), "apiVersion: "+old+"\n") || !strings.Contains(out.String(), fmt.Sprintf("# %-15s %s DeviceClass", "stored as:", old)) || !strings.Contains(out.String(), "kind: DeviceClass") {
		t.Errorf("object not shown in its stored version:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "gpu.example.com") {
		t.Errorf("spec missing:\n%s", out.String())
	}

	out.Reset()
	if err := inspect(env, "/registry/events/default/e1", false, "json", &out); err != nil {
		t.Fatal(err)
	}
	var j struct {
		Storage inventory.Header `json:"storage"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		t.Fatal(err)
	}
	h := j.Storage
	if h.Lease != fmt.Sprintf("%016x", int64(lease)) || h.LeaseTTL == nil || h.LeaseGrantedTTL == nil || *h.LeaseGrantedTTL != 3600 || *h.LeaseTTL <= 0 || *h.LeaseTTL > 3600 {
		t.Errorf("lease header %+v (want lease %x granted 3600)", h, lease)
	}
	if h.Provider != "identity" || h.MediaType != "application/vnd.kubernetes.protobuf" {
		t.Errorf("event header %+v", h)
	}
}

func TestInspectBadKeys(t *testing.T) {
	c := testcluster.NewMixed(t)
	c.Seed()
	env := c.MixedEnv()

	for key, reason := range map[string]string{
		"/registry/secrets/default/lost":           "undecryptable",
		"/registry/example.com/widgets/default/w1": "orphaned",
		"/registry/health":                         "not-an-object",
	} {
		var out bytes.Buffer
		err := inspect(env, key, false, "yaml", &out)
		if err == nil || !strings.Contains(err.Error(), key) || !strings.Contains(err.Error(), reason) {
			t.Errorf("%s: error %v, want one naming the key and %s", key, err, reason)
		}
		if !strings.Contains(out.String(), "# key:") || !strings.Contains(out.String(), fmt.Sprintf("# %-15s %s", "error:", reason)) {
			t.Errorf("%s: header or reason missing:\n%s", key, out.String())
		}
	}

	// The truncated value: header, a corrupt-* reason, no object.
	var out bytes.Buffer
	const truncated = "/registry/configmaps/default/truncated"
	err := inspect(env, truncated, false, "json", &out)
	if err == nil || !strings.Contains(err.Error(), truncated) {
		t.Fatalf("truncated value: error %v, want one naming the key", err)
	}
	var j struct {
		Storage inventory.Header    `json:"storage"`
		Object  map[string]any      `json:"object"`
		Error   *inventory.KeyError `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if j.Error == nil || !strings.HasPrefix(string(j.Error.Reason), "corrupt-") || j.Object != nil || j.Storage.Key != truncated {
		t.Errorf("truncated value output: %s", out.String())
	}

	err = inspect(env, "/registry/secrets/default/nope", false, "yaml", &out)
	if err == nil || err.Error() != "key not found: /registry/secrets/default/nope" {
		t.Errorf("missing key: %v", err)
	}
}
