package seed

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"kube-etcd-migrate/target"
	"os"
	"sort"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/internal/testrig/testetcd"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// seeded is one seeded cluster shared by the tests of this file.
type seeded struct {
	cli *clientv3.Client
	res *Result
	kvs map[string]*kv // every key in etcd
}

type kv struct {
	value []byte
	lease int64
}

func seedT(t *testing.T) *seeded {
	t.Helper()
	srv := testetcd.StartT(t, testetcd.Options{})
	cli, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	res, err := Cluster(context.Background(), cli, Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(context.Background(), "", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	s := &seeded{cli: cli, res: res, kvs: map[string]*kv{}}
	for _, x := range resp.Kvs {
		s.kvs[string(x.Key)] = &kv{value: x.Value, lease: x.Lease}
	}
	return s
}

// keys returns the keys under prefix, sorted.
func (s *seeded) keys(prefix string) []string {
	var out []string
	for k := range s.kvs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// storedGVK reads apiVersion/kind from a protobuf (k8s\x00 + runtime.Unknown) or JSON plaintext.
func storedGVK(t *testing.T, key string, plaintext []byte) (apiVersion, kind, media string) {
	t.Helper()
	if magic := []byte("k8s\x00"); bytes.HasPrefix(plaintext, magic) {
		var u runtime.Unknown
		if err := u.Unmarshal(plaintext[len(magic):]); err != nil {
			t.Fatalf("%s: not a protobuf runtime.Unknown: %v", key, err)
		}
		return u.APIVersion, u.Kind, "protobuf"
	}
	var tm struct{ APIVersion, Kind string }
	if err := json.Unmarshal(plaintext, &tm); err != nil {
		t.Fatalf("%s: neither protobuf nor JSON: %v", key, err)
	}
	return tm.APIVersion, tm.Kind, "json"
}

func TestClusterCounts(t *testing.T) {
	s := seedT(t)
	want := map[string]int{
		"/registry/namespaces/":          6, // default, kube-system, team-00..03
		"/registry/serviceaccounts/":     30,
		"/registry/configmaps/":          30,
		"/registry/secrets/":             25,
		"/registry/services/specs/":      24,
		"/registry/deployments/":         24,
		"/registry/replicasets/":         24,
		"/registry/pods/":                48,
		"/registry/events/":              96,
		"/registry/leases/":              1,
		"/registry/deviceclasses/":       4,
		"/registry/example.com/widgets/": 12,
		"/registry/apiextensions.k8s.io/customresourcedefinitions/": 1,
	}
	total := 0
	for prefix, n := range want {
		if got := len(s.keys(prefix)); got != n {
			t.Errorf("%s: %d keys in etcd, want %d", prefix, got, n)
		}
		total += n
	}
	if got := len(s.keys("/registry/")); got != total || s.res.Objects != total {
		t.Errorf("keys under /registry/: %d in etcd, Result.Objects %d, want %d", got, s.res.Objects, total)
	}
	if s.res.Counts["deviceclasses.resource.k8s.io"] != 4 || s.res.Counts["widgets.example.com"] != 12 || s.res.Counts["pods"] != 48 {
		t.Errorf("Result.Counts = %v", s.res.Counts)
	}
	if crk, ok := s.kvs["compact_rev_key"]; !ok {
		t.Error("compact_rev_key missing")
	} else if _, err := fmt.Sscan(string(crk.value), new(int64)); err != nil {
		t.Errorf("compact_rev_key = %q, want a decimal revision", crk.value)
	}
	if _, ok := s.kvs[s.res.SecretKey]; !ok || !strings.HasPrefix(s.res.SecretKey, "/registry/secrets/team-00/") {
		t.Errorf("Result.SecretKey = %q, not a seeded secret", s.res.SecretKey)
	}
	for _, p := range []string{s.res.OldConfig, s.res.NewConfig} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("encryption config %s: %v, mode %v", p, err, fi.Mode())
		}
	}
}

func TestClusterStoredForms(t *testing.T) {
	s := seedT(t)
	ctx := context.Background()

	// DeviceClasses: protobuf, resource.k8s.io/v1beta1 as 1.33 stored them, v1beta2 from 1.34.
	wantDC := map[string]string{
		"/registry/deviceclasses/gpu.example.com":  "resource.k8s.io/v1beta1",
		"/registry/deviceclasses/fpga.example.com": "resource.k8s.io/v1beta1",
		"/registry/deviceclasses/nic.example.com":  "resource.k8s.io/v1beta2",
		"/registry/deviceclasses/tpu.example.com":  "resource.k8s.io/v1beta2",
	}
	for key, wantGV := range wantDC {
		x, ok := s.kvs[key]
		if !ok {
			t.Errorf("%s missing", key)
			continue
		}
		gv, kind, media := storedGVK(t, key, x.value)
		if gv != wantGV || kind != "DeviceClass" || media != "protobuf" {
			t.Errorf("%s stored as %s %s (%s), want %s DeviceClass protobuf", key, gv, kind, media, wantGV)
		}
	}

	// Secrets: aescbc under key1 (stale under the new config), except the one that
	// predates encryption; each decrypts to a protobuf v1 Secret.
	oldEnc, err := encryption.Load(ctx, s.res.OldConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer oldEnc.Close()
	newEnc, err := encryption.Load(ctx, s.res.NewConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer newEnc.Close()
	secrets := schema.GroupResource{Resource: "secrets"}
	for _, key := range s.keys("/registry/secrets/") {
		v := s.kvs[key].value
		if key == "/registry/secrets/kube-system/bootstrap-legacy" {
			if bytes.HasPrefix(v, []byte("k8s:enc:")) {
				t.Errorf("%s: encrypted, want identity (predates encryption)", key)
			}
			continue
		}
		if !bytes.HasPrefix(v, []byte("k8s:enc:aescbc:v1:key1:")) {
			t.Errorf("%s: not aescbc under key1: %q", key, v[:min(len(v), 24)])
			continue
		}
		plain, info, err := oldEnc.Decrypt(ctx, secrets, key, v)
		if err != nil || info.Stale {
			t.Errorf("%s: old config: err %v, stale %v", key, err, info.Stale)
			continue
		}
		if gv, kind, media := storedGVK(t, key, plain); gv != "v1" || kind != "Secret" || media != "protobuf" {
			t.Errorf("%s decrypts to %s %s (%s)", key, gv, kind, media)
		}
		if _, info, err := newEnc.Decrypt(ctx, secrets, key, v); err != nil || !info.Stale || info.String() != "aescbc:key1" {
			t.Errorf("%s: new config: err %v, %+v; want stale aescbc:key1", key, err, info)
		}
	}

	// Events: every one carries an etcd lease of the apiserver's event TTL.
	leases := map[int64]bool{}
	for _, key := range s.keys("/registry/events/") {
		if s.kvs[key].lease == 0 {
			t.Errorf("%s: no etcd lease", key)
		}
		leases[s.kvs[key].lease] = true
	}
	for id := range leases {
		ttl, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(id))
		if err != nil || ttl.GrantedTTL != EventLeaseTTL || ttl.TTL <= 0 {
			t.Errorf("lease %x: %v, %+v; want granted TTL %d, alive", id, err, ttl, EventLeaseTTL)
		}
	}
	for _, key := range s.keys("/registry/pods/") {
		if s.kvs[key].lease != 0 {
			t.Errorf("%s: has an etcd lease; only events should", key)
		}
	}

	// JSON media type: configmaps and deployments of team-03 only.
	for _, prefix := range []string{"/registry/configmaps/", "/registry/deployments/", "/registry/pods/"} {
		for _, key := range s.keys(prefix) {
			_, _, media := storedGVK(t, key, s.kvs[key].value)
			wantJSON := strings.Contains(key, "/team-03/") && (prefix == "/registry/deployments/" || strings.HasSuffix(key, "-config"))
			if (media == "json") != wantJSON {
				t.Errorf("%s stored as %s", key, media)
			}
		}
	}

	// The CRD: apiextensions.k8s.io/v1beta1 JSON, storedVersions [v1beta1 v1].
	crdKey := "/registry/apiextensions.k8s.io/customresourcedefinitions/widgets.example.com"
	var crd struct {
		APIVersion string `json:"apiVersion"`
		Spec       struct {
			Versions []struct {
				Name    string `json:"name"`
				Storage bool   `json:"storage"`
			} `json:"versions"`
		} `json:"spec"`
		Status struct {
			StoredVersions []string `json:"storedVersions"`
		} `json:"status"`
	}
	if err := json.Unmarshal(s.kvs[crdKey].value, &crd); err != nil {
		t.Fatalf("%s: %v", crdKey, err)
	}
	if crd.APIVersion != "apiextensions.k8s.io/v1beta1" || fmt.Sprint(crd.Status.StoredVersions) != "[v1beta1 v1]" ||
		len(crd.Spec.Versions) != 2 || crd.Spec.Versions[1].Name != "v1" || !crd.Spec.Versions[1].Storage {
		t.Errorf("%s: %+v", crdKey, crd)
	}

	// Custom resources: widget-0 and widget-1 at v1beta1, widget-2 at v1, read by the
	// codec of the CRD as stored now.
	codec, err := customresource.NewCodec(WidgetCRD(), customresource.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range s.keys("/registry/example.com/widgets/") {
		u, info, err := codec.Decode(s.kvs[key].value)
		if err != nil {
			t.Errorf("%s: %v", key, err)
			continue
		}
		want := "v1beta1"
		if strings.HasSuffix(key, "/widget-2") {
			want = "v1"
		}
		if info.GVK.Version != want || info.MediaType != customresource.MediaTypeJSON {
			t.Errorf("%s stored as %s %s, want %s json", key, info.GVK, info.MediaType, want)
		}
		if tier, _, _ := unstructuredString(u.Object, "spec", "tier"); tier != "standard" {
			t.Errorf("%s: spec.tier = %q, want the schema default stored", key, tier)
		}
	}
}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	var cur any = obj
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[p]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// TestClusterStaleSet runs the tool's own decision (pipeline + reencode) over the
// seeded cluster with the new encryption config: exactly the objects the seed meant
// to be stale are stale, and for the reasons it meant; everything else is current.
func TestClusterStaleSet(t *testing.T) {
	s := seedT(t)
	ctx := context.Background()
	env, err := pipeline.Setup(ctx, s.cli, pipeline.Config{Prefix: "/registry", Target: target.Input{EncryptionConfig: s.res.NewConfig}, PageSize: 100, Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	got := map[string]string{} // key -> status/reasons
	_, err = env.Run(ctx, 0, pipeline.Decide, func(page []reencode.Decision) error {
		for _, d := range page {
			v := string(d.Status)
			for _, r := range d.Reasons {
				v += " " + string(r)
			}
			if d.Err != nil {
				v += " " + d.Err.Error()
			}
			got[d.Key] = v
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != s.res.Objects {
		t.Errorf("decided %d keys, seeded %d", len(got), s.res.Objects)
	}
	for key, status := range got {
		var want string
		switch {
		case strings.HasPrefix(key, "/registry/secrets/"):
			want = "stale encryption"
		case strings.HasPrefix(key, "/registry/deviceclasses/"):
			want = "stale storage-version"
		case strings.HasPrefix(key, "/registry/example.com/widgets/") && !strings.HasSuffix(key, "/widget-2"):
			want = "stale storage-version"
		case strings.Contains(key, "/team-03/") && (strings.HasSuffix(key, "-config") || strings.HasPrefix(key, "/registry/deployments/")):
			want = "stale media-type"
		default:
			want = "current"
		}
		if status != want {
			t.Errorf("%s: %s, want %s", key, status, want)
		}
	}
}
