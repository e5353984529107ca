package verify

import (
	"context"
	"fmt"
	"kube-etcd-migrate/target"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	api "k8s.io/kubernetes/pkg/apis/core"

	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

func verifyRun(t *testing.T, env *pipeline.Env, opts Options) *Report {
	t.Helper()
	rep, err := Run(context.Background(), env, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func resourceReport(t *testing.T, rep *Report, name string) ResourceReport {
	t.Helper()
	for _, r := range rep.Resources {
		if r.Name() == name {
			return r
		}
	}
	t.Fatalf("no %s in the report", name)
	return ResourceReport{}
}

// TestVerifyGate: the exit code a runbook gates on moves from 0 (all current) to 3
// (stale, all readable) to 4 (something unreadable), the report says which keys and
// why, and verify never writes.
func TestVerifyGate(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	oldCfg := c.EncryptionConfig("old.yaml", testcluster.AESCBC("key1", 1), testcluster.Identity)
	newCfg := c.EncryptionConfig("new.yaml", testcluster.AESCBC("key2", 2), testcluster.AESCBC("key1", 1), testcluster.Identity)
	otherCfg := c.EncryptionConfig("other.yaml", testcluster.AESCBC("lost", 9))

	for i := 0; i < 3; i++ {
		c.Put(fmt.Sprintf("/registry/configmaps/ns1/cm-%d", i), testcluster.ConfigMapsGR, testcluster.ConfigMap("ns1", fmt.Sprintf("cm-%d", i)), "", "", newCfg)
	}
	rep := verifyRun(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{})
	if rep.ExitCode() != ExitCurrent || rep.Summary.Objects != 3 || rep.Summary.Current != 3 {
		t.Fatalf("all current: exit %d %+v", rep.ExitCode(), rep.Summary)
	}

	for i := 0; i < 8; i++ {
		c.Put(fmt.Sprintf("/registry/secrets/ns1/s-%d", i), testcluster.SecretsGR, testcluster.Secret("ns1", fmt.Sprintf("s-%d", i), "hunter2"), "", "", oldCfg)
	}
	c.Put("/registry/deviceclasses/gpu", testcluster.DeviceClassGR, testcluster.DeviceClass("gpu"), "1.34", "", "")
	rev := c.Revision()
	rep = verifyRun(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{ShowKeys: 2})
	if rep.ExitCode() != ExitStale || rep.Summary.Stale != 9 || rep.Summary.Unreadable != 0 {
		t.Fatalf("stale: exit %d %+v", rep.ExitCode(), rep.Summary)
	}
	secrets := resourceReport(t, rep, "secrets")
	if secrets.Stale != 8 || secrets.StaleBy[reencode.ReasonEncryption] != 8 || len(secrets.StaleKeys) != 2 {
		t.Fatalf("secrets: %+v", secrets)
	}
	if k := secrets.StaleKeys[0]; k.From == nil || k.To == nil || k.From.Encryption != "aescbc:key1" || k.To.Encryption != "aescbc:key2" {
		t.Fatalf("stale key line %+v", k)
	}
	dc := resourceReport(t, rep, "deviceclasses.resource.k8s.io")
	if dc.StaleBy[reencode.ReasonVersion] != 1 || dc.StaleKeys[0].From.Version != "resource.k8s.io/v1beta2" || dc.StaleKeys[0].To.Version != "resource.k8s.io/v1" {
		t.Fatalf("deviceclasses: %+v", dc)
	}
	if c.Revision() != rev {
		t.Fatal("verify wrote to etcd")
	}

	// Unreadable: a secret under a key the config does not have, and garbage.
	c.Put("/registry/secrets/ns2/lost", testcluster.SecretsGR, testcluster.Secret("ns2", "lost", "hunter2"), "", "", otherCfg)
	if _, err := c.Cli.Put(context.Background(), "/registry/configmaps/ns2/garbage", "k8s\x00\x0a\x0bnot-protobuf"); err != nil {
		t.Fatal(err)
	}
	rep = verifyRun(t, c.Env(pipeline.Config{Target: target.Input{EncryptionConfig: newCfg}}), Options{})
	if rep.ExitCode() != ExitUnreadable || rep.Summary.Unreadable != 2 || rep.Summary.Objects != 14 {
		t.Fatalf("unreadable: exit %d %+v", rep.ExitCode(), rep.Summary)
	}
	secrets = resourceReport(t, rep, "secrets")
	if secrets.UnreadableBy[decode.ReasonUndecryptable] != 1 || secrets.UnreadableKeys[0].Key != "/registry/secrets/ns2/lost" || !strings.Contains(secrets.UnreadableKeys[0].Detail, "aescbc:lost") {
		t.Fatalf("secrets unreadable: %+v", secrets.UnreadableKeys)
	}
	cms := resourceReport(t, rep, "configmaps")
	if cms.Unreadable != 1 || cms.UnreadableKeys[0].Key != "/registry/configmaps/ns2/garbage" {
		t.Fatalf("configmaps unreadable: %+v", cms)
	}
}

// TestVerifyFilters: --resource and --namespace limit the audit.
func TestVerifyFilters(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	for _, ns := range []string{"a", "b"} {
		c.Put("/registry/configmaps/"+ns+"/cm", testcluster.ConfigMapsGR, testcluster.ConfigMap(ns, "cm"), "", decode.MediaTypeJSON, "")
		c.Put("/registry/secrets/"+ns+"/s", testcluster.SecretsGR, testcluster.Secret(ns, "s", "x"), "", "", "")
	}
	rep := verifyRun(t, c.Env(pipeline.Config{Resources: []string{"configmaps"}, Namespace: "b"}), Options{})
	if rep.Summary.Objects != 1 || rep.Summary.Stale != 1 || len(rep.Resources) != 1 || rep.Resources[0].StaleKeys[0].Key != "/registry/configmaps/b/cm" {
		t.Fatalf("%+v", rep.Summary)
	}
	if rep.Resources[0].StaleBy[reencode.ReasonMediaType] != 1 {
		t.Fatalf("reasons %v", rep.Resources[0].StaleBy)
	}
}

// TestEncodingOnlyDoesNotFailTheGate: an object in the target version, media type
// and key, stored without the defaults kube-apiserver applies on read, is current
// for the gate (exit 0) and reported as one migrate would re-encode.
func TestEncodingOnlyDoesNotFailTheGate(t *testing.T) {
	c := testcluster.New(t, testetcd.Options{})
	pod := &api.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "a", UID: "uid-p", CreationTimestamp: metav1.Unix(1700000000, 0)},
		Spec:       api.PodSpec{Containers: []api.Container{{Name: "c", Image: "nginx"}}},
	}
	c.Put("/registry/pods/a/p", schema.GroupResource{Resource: "pods"}, pod, "", "", "")
	rep := verifyRun(t, c.Env(pipeline.Config{}), Options{})
	pods := resourceReport(t, rep, "pods")
	if rep.ExitCode() != ExitCurrent || pods.Current != 1 || pods.Reencode != 1 || rep.Summary.Reencode != 1 {
		t.Fatalf("exit %d, pods %+v", rep.ExitCode(), pods)
	}
}
