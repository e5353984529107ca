package target_test

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/testrig/testcluster"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/target"
)

// TestResolveRefusesWhatItCannotWriteAs: a writing run with no release named
// is refused with a typed error, as is a release out of the tool's range; a
// read-only run assumes the linked release.
func TestResolveRefusesWhatItCannotWriteAs(t *testing.T) {
	ctx := context.Background()
	_, err := target.Resolve(ctx, nil, target.Input{RequireRelease: true})
	var unknown *target.UnknownReleaseError
	if !errors.As(err, &unknown) || len(unknown.Versions) == 0 {
		t.Fatalf("no release named, writing: got %v, want *target.UnknownReleaseError listing the supported releases", err)
	}
	_, err = target.Resolve(ctx, nil, target.Input{Release: "1.20"})
	var rel *release.Error
	if !errors.As(err, &rel) {
		t.Fatalf("release 1.20: got %v, want *release.Error", err)
	}
	tg, err := target.Resolve(ctx, nil, target.Input{})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if tg.Named() || tg.Release().String() != release.Linked() {
		t.Fatalf("nothing named, read-only: release %s (named %v), want the linked %s assumed", tg.Release(), tg.Named(), release.Linked())
	}
	if tg.Storage() == nil || tg.Update() == nil || tg.Encryption() == nil {
		t.Fatal("a resolved target lacks its storage configuration, update path or encryption")
	}
	versions := release.Versions()
	oldest := versions[0]
	tg2, err := target.Resolve(ctx, nil, target.Input{Release: oldest, RequireRelease: true})
	if err != nil {
		t.Fatalf("release %s: %v", oldest, err)
	}
	defer tg2.Close()
	if !tg2.Named() || tg2.Release().String() != oldest {
		t.Fatalf("release %s given: got %s (named %v)", oldest, tg2.Release(), tg2.Named())
	}
}

// TestKubeadmReleaseSettled: the release kubeadm's ClusterConfiguration in
// etcd names is the target's when nothing else names one, run with the
// command line's --emulated-version; the command line's configuration is
// left as it was, and a second Resolve on the target's Input writes for the
// same release without reading etcd again.
func TestKubeadmReleaseSettled(t *testing.T) {
	ctx := context.Background()
	c := testcluster.New(t, testetcd.Options{})
	cm := testcluster.ConfigMap("kube-system", "kubeadm-config")
	cm.Data = map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.35.4\n"}
	c.Put(target.KubeadmConfigKey("/registry"), testcluster.ConfigMapsGR, cm, "", "", "")
	api, err := apiserverconfig.Load(apiserverconfig.Input{})
	if err != nil {
		t.Fatal(err)
	}
	tg, err := target.Resolve(ctx, etcdscan.ClientSource{Client: c.Cli}, target.Input{APIServer: api, Prefix: "/registry", ReadKubeadm: true, RequireRelease: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	ev := tg.Release().Effective()
	if tg.Release().String() != "1.35" || tg.ReleaseFrom() != apiserverconfig.FromKubeadm || ev.EmulationVersion().String() != "1.35" || ev.MinCompatibilityVersion().String() != "1.34" {
		t.Errorf("kubeadm-config v1.35.4: release %s from %q, effective %v; want 1.35 from the kubeadm-config", tg.Release(), tg.ReleaseFrom(), ev)
	}
	if api.Release().String() != release.Linked() || api.From["release"] != "" {
		t.Errorf("the command line's configuration changed: release %s from %q", api.Release(), api.From["release"])
	}
	again, err := target.Resolve(ctx, nil, tg.Input())
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Release().String() != "1.35" || again.ReleaseFrom() != apiserverconfig.FromKubeadm {
		t.Errorf("resolved again: release %s from %q, want 1.35 from the kubeadm-config", again.Release(), again.ReleaseFrom())
	}
	if got, err := again.Storage().Codec(schema.GroupResource{Group: "resource.k8s.io", Resource: "devicetaintrules"}); err != nil || got.StorageVersion.String() != "resource.k8s.io/v1alpha3" {
		t.Errorf("resolved again: DeviceTaintRules stored as %v (%v), kube-apiserver 1.35 stores resource.k8s.io/v1alpha3", got, err)
	}
}
