package command

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericfeatures "k8s.io/apiserver/pkg/features"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/target"
	"kube-etcd-migrate/verify"
)

func verifyRun(t *testing.T, env *pipeline.Env) *verify.Report {
	t.Helper()
	rep, err := verify.Run(context.Background(), env, verify.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func verifyResource(t *testing.T, rep *verify.Report, name string) verify.ResourceReport {
	t.Helper()
	for _, r := range rep.Resources {
		if r.Name() == name {
			return r
		}
	}
	t.Fatalf("no %s in the report", name)
	return verify.ResourceReport{}
}

// TestVerifyReportFormats: verify's report of current, stale and unreadable
// objects in every output format: the documented fields, and never a secret
// value.
func TestVerifyReportFormats(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	otherCfg := c.EncryptionConfig("other.yaml", testcluster.AESCBC("lost", 9))
	for i := 0; i < 3; i++ {
		c.Put(fmt.Sprintf("/registry/configmaps/ns1/cm-%d", i), testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", fmt.Sprintf("cm-%d", i)), "", "", newCfg)
	}
	for i := 0; i < 8; i++ {
		c.Put(fmt.Sprintf("/registry/secrets/ns1/s-%d", i), testcluster.SecretsGR, testcluster.Secret("ns1", fmt.Sprintf("s-%d", i), "hunter2"), "", "", oldCfg)
	}
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	// Unreadable: a secret under a key the config does not have, and garbage.
	c.Put("/registry/secrets/ns2/lost", testcluster.SecretsGR, testcluster.Secret("ns2", "lost", "hunter2"), "", "", otherCfg)
	if _, err := c.Cli.Put(context.Background(), "/registry/configmaps/ns2/garbage", "k8s\x00\x0a\x0bnot-protobuf"); err != nil {
		t.Fatal(err)
	}
	rep := verifyRun(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}))
	if rep.ExitCode() != verify.ExitUnreadable || rep.Summary.Unreadable != 2 || rep.Summary.Objects != 14 {
		t.Fatalf("unreadable: exit %d %+v", rep.ExitCode(), rep.Summary)
	}

	// Every output format: the documented fields, and never a secret value.
	for _, format := range []string{"table", "json", "yaml"} {
		var out bytes.Buffer
		if err := printReport(&out, format, verifyReport{rep, nil}); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if strings.Contains(out.String(), "hunter2") || strings.Contains(out.String(), "color=blue") {
			t.Fatalf("%s output contains object data", format)
		}
		if format == "table" {
			if !strings.Contains(out.String(), "/registry/secrets/ns2/lost") {
				t.Fatalf("table does not list the unreadable key:\n%s", out.String())
			}
			continue
		}
		data := out.Bytes()
		if format == "yaml" {
			var err error
			if data, err = yaml.YAMLToJSON(data); err != nil {
				t.Fatal(err)
			}
		}
		var doc struct {
			Summary   map[string]int64 `json:"summary"`
			Resources []struct {
				Group, Resource                     string
				Objects, Current, Stale, Unreadable int64
			} `json:"resources"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if doc.Summary["objects"] != 14 || doc.Summary["current"] != 3 || doc.Summary["stale"] != 9 || doc.Summary["unreadable"] != 2 || len(doc.Resources) != 3 {
			t.Fatalf("%s document: %+v", format, doc)
		}
	}
}

// TestVerifyNamesTheExpectedMediaType: with CBORServingAndStorage on, kube-apiserver
// stores custom resources as CBOR, so a custom resource stored as JSON is stale by
// media type, and verify names both (the JSON report and the table's WHY column).
func TestVerifyNamesTheExpectedMediaType(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com", UID: "crd-uid", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true, Schema: &apiextensionsv1.CustomResourceValidation{
				OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)},
			}}},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{StoredVersions: []string{"v1"}},
	}
	c.Put("/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com", decode.CRDGroupResource, crd, "", "", "")
	c.PutRaw("/registry/example.com/widgets/ns1/w", []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"creationTimestamp":"2023-11-14T22:13:20Z","generation":1,"name":"w","namespace":"ns1","uid":"uid-w"},"spec":{"size":1}}`+"\n"))

	// Gate off: JSON is what the apiserver stores.
	rep := verifyRun(t, c.Env(pipeline.Config{Resources: []string{"widgets.example.com"}}))
	if w := verifyResource(t, rep, "widgets.example.com"); w.Current != 1 || w.TargetMediaType != "json" {
		t.Fatalf("gate off: %+v", w)
	}

	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, genericfeatures.CBORServingAndStorage, true)
	rep = verifyRun(t, c.Env(pipeline.Config{Resources: []string{"widgets.example.com"}}))
	w := verifyResource(t, rep, "widgets.example.com")
	if w.Stale != 1 || w.StaleBy[reencode.ReasonMediaType] != 1 || w.TargetMediaType != "cbor" || w.StaleMediaTypes["json"] != 1 {
		t.Fatalf("gate on: %+v", w)
	}
	if k := w.StaleKeys[0]; k.From.MediaType != "json" || k.To.MediaType != "cbor" {
		t.Fatalf("stale key from %+v to %+v", k.From, k.To)
	}
	var table bytes.Buffer
	if err := printReport(&table, "table", verifyReport{rep, nil}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "media-type=1 (json -> cbor)") || !strings.Contains(table.String(), "(protobuf, custom resources cbor;") {
		t.Fatalf("table does not name the media types:\n%s", table.String())
	}
}
