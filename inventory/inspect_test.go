package inventory

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestInspectRedactsSecrets(t *testing.T) {
	c := newCluster(t)
	c.seed()
	env := c.env()
	const key = "/registry/secrets/default/db"
	b64 := base64.StdEncoding.EncodeToString([]byte(password))

	var out bytes.Buffer
	if err := Inspect(context.Background(), env, key, false, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"# key:", key, "aescbc, key key1", "v1 Secret", "<redacted 20 bytes>", "<redacted 5 bytes>", "team: db", "kind: Secret", "apiVersion: v1"} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, password) || strings.Contains(text, b64) {
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
	if err := Inspect(context.Background(), env, key, true, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "password: "+b64) {
		t.Errorf("--show-secrets does not show data.password:\n%s", out.String())
	}

	out.Reset()
	if err := Inspect(context.Background(), env, key, false, "json", &out); err != nil {
		t.Fatal(err)
	}
	var j struct {
		Storage Header         `json:"storage"`
		Object  map[string]any `json:"object"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		t.Fatalf("inspect JSON: %v\n%s", err, out.String())
	}
	if j.Storage.Provider != "aescbc" || j.Storage.KeyName != "key1" || j.Storage.Kind != "Secret" || j.Storage.APIVersion != "v1" || j.Storage.Size == 0 || j.Storage.ModRevision == 0 {
		t.Errorf("storage header %+v", j.Storage)
	}
	if strings.Contains(out.String(), password) || strings.Contains(out.String(), b64) {
		t.Error("inspect JSON printed the secret value")
	}
	md, _ := j.Object["metadata"].(map[string]any)
	if md["name"] != "db" || md["resourceVersion"] != fmt.Sprint(j.Storage.ModRevision) {
		t.Errorf("metadata %v", md)
	}
}

func TestInspectStoredVersionAndLease(t *testing.T) {
	c := newCluster(t)
	lease := c.seed()
	env := c.env()

	var out bytes.Buffer
	if err := Inspect(context.Background(), env, "/registry/deviceclasses/old-gpu", false, "yaml", &out); err != nil {
		t.Fatal(err)
	}
	old := storageVersion(t, "1.34", devclassGR)
	if !strings.Contains(out.String(), "apiVersion: "+old+"\n") || !strings.Contains(out.String(), fmt.Sprintf("# %-15s %s DeviceClass", "stored as:", old)) || !strings.Contains(out.String(), "kind: DeviceClass") {
		t.Errorf("object not shown in its stored version:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "gpu.example.com") {
		t.Errorf("spec missing:\n%s", out.String())
	}

	out.Reset()
	if err := Inspect(context.Background(), env, "/registry/events/default/e1", false, "json", &out); err != nil {
		t.Fatal(err)
	}
	var j struct {
		Storage Header `json:"storage"`
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
	c := newCluster(t)
	c.seed()
	env := c.env()

	for key, reason := range map[string]string{
		"/registry/secrets/default/lost":           "undecryptable",
		"/registry/example.com/widgets/default/w1": "orphaned",
		"/registry/health":                         "not-an-object",
	} {
		var out bytes.Buffer
		err := Inspect(context.Background(), env, key, false, "yaml", &out)
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
	err := Inspect(context.Background(), env, truncated, false, "json", &out)
	if err == nil || !strings.Contains(err.Error(), truncated) {
		t.Fatalf("truncated value: error %v, want one naming the key", err)
	}
	var j struct {
		Storage Header         `json:"storage"`
		Object  map[string]any `json:"object"`
		Error   *KeyError      `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &j); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if j.Error == nil || !strings.HasPrefix(string(j.Error.Reason), "corrupt-") || j.Object != nil || j.Storage.Key != truncated {
		t.Errorf("truncated value output: %s", out.String())
	}

	err = Inspect(context.Background(), env, "/registry/secrets/default/nope", false, "yaml", &out)
	if err == nil || err.Error() != "key not found: /registry/secrets/default/nope" {
		t.Errorf("missing key: %v", err)
	}
}
