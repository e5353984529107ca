package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/apis/apps"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/resource"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/release"
)

// The mix, in percent of N (objects are assigned by index, deterministically).
type kind int

const (
	kSecret kind = iota
	kConfigMap
	kPod
	kDeployment
	kEvent
	kWidget
	kDeviceClass
	numKinds
)

var kindNames = [numKinds]string{"secrets", "configmaps", "pods", "deployments", "events", "widgets", "deviceclasses"}

// mixBounds[k] is the upper bound (exclusive) of kind k in i%100.
var mixBounds = [numKinds]int{30, 45, 65, 75, 90, 98, 100}

const (
	namespaces  = 20
	crGroup     = "bench.example.com"
	crdName     = "widgets." + crGroup
	crdKey      = "/registry/apiextensions.k8s.io/customresourcedefinitions/" + crdName
	eventsPerLs = 1000 // keys sharing one etcd lease, as kube-apiserver does
	leaseTTL    = 24 * 3600
	// Seeding transactions: etcd's default --max-txn-ops and well below --max-request-bytes.
	seedTxnOps   = 128
	seedTxnBytes = 1 << 20
)

var grOf = [numKinds]schema.GroupResource{
	{Resource: "secrets"},
	{Resource: "configmaps"},
	{Resource: "pods"},
	{Group: "apps", Resource: "deployments"},
	{Resource: "events"},
	{Group: crGroup, Resource: "widgets"},
	{Group: "resource.k8s.io", Resource: "deviceclasses"},
}

// objSpec says what object i is.
type objSpec struct {
	i     int
	kind  kind
	ns    string
	name  string
	key   string
	stale bool
}

// generator builds the deterministic keyspace: which object index i is, and its bytes.
type generator struct {
	n                       int
	staleVersion, staleKey  float64
	oldEnc, newEnc          *encryption.Transformers
	current, staleOld, json *decode.StorageConfig
	crCodec                 *customresource.Codec
	crd                     *apiextensionsv1.CustomResourceDefinition
	leases                  []clientv3.LeaseID
	secretData              [4][]byte // 1, 2, 3, 4 KiB
	templates               map[string]runtime.Object
	// rotation: the key-rotation dataset (every object a 2 KB secret with the
	// managedFields a client's create leaves, under the old key); see rotation.go.
	rotation bool
	// cr: the custom-resource dataset (every object a widget with several
	// managedFields entries, some stored in the CRD's other version); see cr.go.
	cr bool
}

func mix(i int) float64 {
	// splitmix64: a stable pseudo-random share per index.
	z := uint64(i)*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) / float64(1<<53)
}

func (g *generator) spec(i int) objSpec {
	b := i % 100
	k := kind(0)
	for b >= mixBounds[k] && !g.rotation && !g.cr {
		k++
	}
	if g.cr {
		k = kWidget
	}
	s := objSpec{i: i, kind: k, ns: fmt.Sprintf("bench-%02d", i%namespaces)}
	share := g.staleVersion
	if k == kSecret || k == kConfigMap {
		share = g.staleKey
	}
	s.stale = mix(i) < share
	switch k {
	case kSecret:
		s.name = "secret-" + strconv.Itoa(i)
		s.key = "/registry/secrets/" + s.ns + "/" + s.name
	case kConfigMap:
		s.name = "cm-" + strconv.Itoa(i)
		s.key = "/registry/configmaps/" + s.ns + "/" + s.name
	case kPod:
		s.name = "pod-" + strconv.Itoa(i)
		s.key = "/registry/pods/" + s.ns + "/" + s.name
	case kDeployment:
		s.name = "deploy-" + strconv.Itoa(i)
		s.key = "/registry/deployments/" + s.ns + "/" + s.name
	case kEvent:
		s.name = "ev-" + strconv.Itoa(i)
		s.key = "/registry/events/" + s.ns + "/" + s.name
	case kWidget:
		s.name = "w-" + strconv.Itoa(i)
		s.key = "/registry/" + crGroup + "/widgets/" + s.ns + "/" + s.name
	case kDeviceClass:
		s.ns = ""
		s.name = "dc-" + strconv.Itoa(i)
		s.key = "/registry/deviceclasses/" + s.name
	}
	return s
}

var created = metav1.Unix(1700000000, 0)

func uid(i int) types.UID { return types.UID(fmt.Sprintf("00000000-0000-4000-8000-%012d", i)) }

func newGenerator(ctx context.Context, n int, staleVersion, staleKey float64, oldCfg, newCfg string, rotation bool) (*generator, error) {
	g := &generator{n: n, staleVersion: staleVersion, staleKey: staleKey, rotation: rotation}
	var err error
	if g.oldEnc, err = encryption.Load(ctx, oldCfg); err != nil {
		return nil, err
	}
	if g.newEnc, err = encryption.Load(ctx, newCfg); err != nil {
		return nil, err
	}
	if g.current, err = decode.NewStorageConfig(""); err != nil {
		return nil, err
	}
	old, err := release.Named("1.34")
	if err != nil {
		return nil, err
	}
	if g.staleOld, err = decode.NewStorageConfigFor(decode.StorageOptions{Release: old}); err != nil {
		return nil, err
	}
	if g.json, err = decode.NewStorageConfig(decode.MediaTypeJSON); err != nil {
		return nil, err
	}
	g.crd = widgetCRD()
	if g.crCodec, err = customresource.NewCodec(g.crd, customresource.Options{}); err != nil {
		return nil, fmt.Errorf("widget codec: %w", err)
	}
	rnd := rand.New(rand.NewSource(1))
	for j := range g.secretData {
		b := make([]byte, (j+1)*1024-200) // the rest is metadata and envelope
		rnd.Read(b)
		g.secretData[j] = b
	}
	return g, g.buildTemplates()
}

func widgetCRD() *apiextensionsv1.CustomResourceDefinition {
	schema := &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"size":     {Type: "integer"},
				"color":    {Type: "string"},
				"replicas": {Type: "integer"},
				"tags":     {Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}},
			}},
			"status": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"ready": {Type: "boolean"}}},
		},
	}}
	names := apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: crdName, UID: uid(999999999), CreationTimestamp: created, Generation: 1},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: crGroup, Names: names, Scope: apiextensionsv1.NamespaceScoped,
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Storage: false, Schema: schema},
				{Name: "v1", Served: true, Storage: true, Schema: schema},
			},
		},
	}
	crd.Status.AcceptedNames = names
	crd.Status.StoredVersions = []string{"v1beta1", "v1"}
	crd.Status.Conditions = []apiextensionsv1.CustomResourceDefinitionCondition{
		{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue, Reason: "NoConflicts", LastTransitionTime: created},
		{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue, Reason: "InitialNamesAccepted", LastTransitionTime: created},
	}
	return crd
}

// fixpoint returns obj as kube-apiserver reads it back (defaulted), so that
// re-encoding the seeded bytes gives the same bytes: "current" objects are current.
func fixpoint(sc *decode.StorageConfig, gr schema.GroupResource, obj runtime.Object) (runtime.Object, error) {
	rc, err := sc.Codec(gr)
	if err != nil {
		return nil, err
	}
	var out runtime.Object = obj
	var prev []byte
	for round := 0; round < 3; round++ {
		b, err := runtime.Encode(rc.Codec, out)
		if err != nil {
			return nil, fmt.Errorf("%s: encode template: %w", gr, err)
		}
		if prev != nil && bytes.Equal(b, prev) {
			return out, nil
		}
		prev = b
		if out, err = runtime.Decode(rc.Codec, b); err != nil {
			return nil, fmt.Errorf("%s: decode template: %w", gr, err)
		}
	}
	return nil, fmt.Errorf("%s: template does not reach a fixed point after defaulting", gr)
}

func podSpec() api.PodSpec {
	return api.PodSpec{
		Containers: []api.Container{{
			Name: "app", Image: "registry.k8s.io/e2e-test-images/agnhost:2.53",
			Args:                   []string{"netexec", "--http-port=8080"},
			Ports:                  []api.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: api.ProtocolTCP}},
			Env:                    []api.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "REGION", Value: "eu-west-1"}},
			Resources:              api.ResourceRequirements{},
			TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: api.TerminationMessageReadFile,
			ImagePullPolicy: api.PullIfNotPresent,
		}},
		RestartPolicy: api.RestartPolicyAlways, DNSPolicy: api.DNSClusterFirst, SchedulerName: "default-scheduler",
		SecurityContext: &api.PodSecurityContext{}, TerminationGracePeriodSeconds: ptr.To[int64](30),
	}
}

func (g *generator) buildTemplates() error {
	labels := map[string]string{"app": "web", "tier": "frontend"}
	tpl := map[string]runtime.Object{
		"secret":    &api.Secret{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "t", CreationTimestamp: created}, Type: api.SecretTypeOpaque},
		"rotation":  rotationSecret(),
		"configmap": &api.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "t", CreationTimestamp: created, Labels: labels}, Data: map[string]string{"app.properties": strings.Repeat("feature.flag.enabled=true\n", 30)}},
		"pod": &api.Pod{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "t", CreationTimestamp: created, Labels: labels}, Spec: podSpec(),
			Status: api.PodStatus{Phase: api.PodRunning, PodIPs: []api.PodIP{{IP: "10.0.0.7"}}, Conditions: []api.PodCondition{{Type: api.PodReady, Status: api.ConditionTrue, LastTransitionTime: created}}}},
		"deployment": &apps.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "t", CreationTimestamp: created, Labels: labels, Generation: 1},
			Spec: apps.DeploymentSpec{Replicas: 3, Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: api.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec()}}},
		"event": &api.Event{ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: "t", CreationTimestamp: created},
			InvolvedObject: api.ObjectReference{Kind: "Pod", Namespace: "t", Name: "web-0", APIVersion: "v1"},
			Reason:         "Scheduled", Message: "Successfully assigned bench/web-0 to node-1", Type: api.EventTypeNormal, Count: 1,
			Source: api.EventSource{Component: "default-scheduler"}, FirstTimestamp: created, LastTimestamp: created},
		"deviceclass": &resource.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "t", CreationTimestamp: created},
			Spec: resource.DeviceClassSpec{Selectors: []resource.DeviceSelector{{CEL: &resource.CELDeviceSelector{Expression: `device.driver == "gpu.example.com"`}}}}},
	}
	grs := map[string]schema.GroupResource{"secret": grOf[kSecret], "rotation": grOf[kSecret], "configmap": grOf[kConfigMap], "pod": grOf[kPod], "deployment": grOf[kDeployment], "event": grOf[kEvent], "deviceclass": grOf[kDeviceClass]}
	g.templates = map[string]runtime.Object{}
	for name, obj := range tpl {
		fp, err := fixpoint(g.current, grs[name], obj)
		if err != nil {
			return err
		}
		g.templates[name] = fp
	}
	return nil
}

// worker holds one goroutine's private copies of the templates.
type worker struct {
	g   *generator
	obj map[string]runtime.Object
	buf bytes.Buffer
}

func (g *generator) worker() *worker {
	w := &worker{g: g, obj: map[string]runtime.Object{}}
	for k, v := range g.templates {
		w.obj[k] = v.DeepCopyObject()
	}
	return w
}

func (w *worker) encode(sc *decode.StorageConfig, gr schema.GroupResource, obj runtime.Object) ([]byte, error) {
	rc, err := sc.Codec(gr)
	if err != nil {
		return nil, err
	}
	w.buf.Reset()
	if err := rc.Codec.Encode(obj, &w.buf); err != nil {
		return nil, err
	}
	return bytes.Clone(w.buf.Bytes()), nil
}

func setMeta(obj runtime.Object, s objSpec) {
	m, _ := obj.(metav1.Object)
	m.SetName(s.name)
	m.SetNamespace(s.ns)
	m.SetUID(uid(s.i))
}

// value returns the bytes object s has when seeded (stale or current form).
func (w *worker) value(ctx context.Context, s objSpec) ([]byte, error) {
	g := w.g
	gr := grOf[s.kind]
	var plain []byte
	var err error
	switch s.kind {
	case kSecret:
		if g.rotation {
			o := w.obj["rotation"]
			setMeta(o, s)
			plain, err = w.encode(g.current, gr, o)
			break
		}
		o := w.obj["secret"].(*api.Secret)
		setMeta(o, s)
		o.Data = map[string][]byte{"tls.key": g.secretData[s.i%4]}
		plain, err = w.encode(g.current, gr, o)
	case kConfigMap:
		o := w.obj["configmap"]
		setMeta(o, s)
		plain, err = w.encode(g.current, gr, o)
	case kPod, kDeployment, kEvent:
		name := map[kind]string{kPod: "pod", kDeployment: "deployment", kEvent: "event"}[s.kind]
		o := w.obj[name]
		setMeta(o, s)
		if e, ok := o.(*api.Event); ok {
			e.InvolvedObject.Namespace = s.ns
		}
		sc := g.current
		if s.stale {
			sc = g.json // --storage-media-type=application/json: stale by media type
		}
		plain, err = w.encode(sc, gr, o)
	case kDeviceClass:
		o := w.obj["deviceclass"]
		setMeta(o, s)
		sc := g.current
		if s.stale {
			sc = g.staleOld // stored by an apiserver of release 1.34: older storage version
		}
		plain, err = w.encode(sc, gr, o)
	case kWidget:
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": crGroup + "/v1", "kind": "Widget",
			"metadata": map[string]any{"name": s.name, "namespace": s.ns, "uid": string(uid(s.i)), "generation": int64(1),
				"creationTimestamp": "2023-11-14T22:13:20Z", "labels": map[string]any{"app": "web"}},
			"spec": map[string]any{"size": int64(s.i%7 + 1), "color": "blue", "replicas": int64(3), "tags": []any{"a", "b", "c"}},
		}}
		if g.cr {
			crWidget(u, s)
		}
		if s.stale {
			u.SetAPIVersion(crGroup + "/v1beta1") // stored version v1beta1, storage version now v1
			w.buf.Reset()
			err = unstructured.UnstructuredJSONScheme.Encode(u, &w.buf)
			plain = bytes.Clone(w.buf.Bytes())
		} else {
			plain, err = g.crCodec.Encode(ctx, u)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.key, err)
	}
	if s.kind == kSecret || s.kind == kConfigMap {
		enc := g.newEnc
		if s.stale {
			enc = g.oldEnc // aescbc key1, while the target config writes key2
		}
		return enc.Encrypt(ctx, gr, s.key, plain)
	}
	return plain, nil
}

// fixedObjects are the namespaces and the CRD (current, except that the CRD lists
// v1beta1 in status.storedVersions, which migrate trims).
func (g *generator) fixedObjects() (map[string][]byte, error) {
	out := map[string][]byte{}
	for n := 0; n < namespaces; n++ {
		ns := &api.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("bench-%02d", n), UID: uid(900000000 + n), CreationTimestamp: created},
			Spec: api.NamespaceSpec{Finalizers: []api.FinalizerName{api.FinalizerKubernetes}}, Status: api.NamespaceStatus{Phase: api.NamespaceActive}}
		fp, err := fixpoint(g.current, schema.GroupResource{Resource: "namespaces"}, ns)
		if err != nil {
			return nil, err
		}
		rc, _ := g.current.Codec(schema.GroupResource{Resource: "namespaces"})
		b, err := runtime.Encode(rc.Codec, fp)
		if err != nil {
			return nil, err
		}
		out["/registry/namespaces/"+ns.Name] = b
	}
	if g.rotation {
		return out, nil // secrets only: no CRD
	}
	fp, err := fixpoint(g.current, decode.CRDGroupResource, g.crd.DeepCopy())
	if err != nil {
		return nil, err
	}
	rc, _ := g.current.Codec(decode.CRDGroupResource)
	b, err := runtime.Encode(rc.Codec, fp)
	if err != nil {
		return nil, err
	}
	out[crdKey] = b
	return out, nil
}

// staleKeys is the set of keys migrate must rewrite (the CAS ceiling rewrites the same).
func (g *generator) staleKeys() map[string]bool {
	m := map[string]bool{}
	for i := 0; i < g.n; i++ {
		if s := g.spec(i); s.stale {
			m[s.key] = true
		}
	}
	return m
}

func (g *generator) grantLeases(ctx context.Context, cli *clientv3.Client) error {
	n := g.n/eventsPerLs + 1
	for j := 0; j < n; j++ {
		resp, err := cli.Grant(ctx, leaseTTL)
		if err != nil {
			return fmt.Errorf("grant lease: %w", err)
		}
		g.leases = append(g.leases, resp.ID)
	}
	return nil
}

// seed writes every object for which want(spec) holds, with multi-key transactions
// from several goroutines, plus the fixed objects (namespaces, CRD) when fixed is set.
func (g *generator) seed(ctx context.Context, cli *clientv3.Client, want func(objSpec) bool, fixed bool) (int, error) {
	if fixed {
		objs, err := g.fixedObjects()
		if err != nil {
			return 0, err
		}
		var ops []clientv3.Op
		for k, v := range objs {
			ops = append(ops, clientv3.OpPut(k, string(v)))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return 0, fmt.Errorf("seed namespaces and CRD: %w", err)
		}
	}
	const workers = 4
	var wg sync.WaitGroup
	errs := make([]error, workers)
	counts := make([]int, workers)
	for wi := 0; wi < workers; wi++ {
		wg.Add(1)
		go func(wi int) {
			defer wg.Done()
			w := g.worker()
			var ops []clientv3.Op
			size := 0
			flush := func() error {
				if len(ops) == 0 {
					return nil
				}
				_, err := cli.Txn(ctx).Then(ops...).Commit()
				ops, size = ops[:0], 0
				return err
			}
			for i := wi; i < g.n; i += workers {
				s := g.spec(i)
				if !want(s) {
					continue
				}
				v, err := w.value(ctx, s)
				if err != nil {
					errs[wi] = err
					return
				}
				var opts []clientv3.OpOption
				if s.kind == kEvent {
					opts = append(opts, clientv3.WithLease(g.leases[i/eventsPerLs]))
				}
				if len(ops) == seedTxnOps || size+len(v)+len(s.key) > seedTxnBytes {
					if err := flush(); err != nil {
						errs[wi] = fmt.Errorf("seed txn: %w", err)
						return
					}
				}
				ops = append(ops, clientv3.OpPut(s.key, string(v), opts...))
				size += len(v) + len(s.key)
				counts[wi]++
			}
			if err := flush(); err != nil {
				errs[wi] = fmt.Errorf("seed txn: %w", err)
			}
		}(wi)
	}
	wg.Wait()
	total := 0
	for wi := range errs {
		if errs[wi] != nil {
			return 0, errs[wi]
		}
		total += counts[wi]
	}
	return total, nil
}

func (g *generator) staleByKind() map[string]int {
	m := map[string]int{}
	for i := 0; i < g.n; i++ {
		if s := g.spec(i); s.stale {
			m[kindNames[s.kind]]++
		}
	}
	return m
}

// writeEncryptionConfigs writes the EncryptionConfiguration the cluster was seeded
// with (old: aescbc [key1]) and the target one (new: aescbc [key2, key1]), both for
// secrets and configmaps with identity last.
func writeEncryptionConfigs(dir string) (oldPath, newPath string, err error) {
	rnd := rand.New(rand.NewSource(7))
	key := func() string {
		b := make([]byte, 32)
		rnd.Read(b)
		return base64.StdEncoding.EncodeToString(b)
	}
	k1, k2 := key(), key()
	entry := func(name, secret string) string {
		return fmt.Sprintf("          - name: %s\n            secret: %s\n", name, secret)
	}
	const tpl = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n  - resources: [secrets, configmaps]\n    providers:\n    - aescbc:\n        keys:\n%s    - identity: {}\n"
	oldPath, newPath = filepath.Join(dir, "encryption-old.yaml"), filepath.Join(dir, "encryption-new.yaml")
	if err := os.WriteFile(oldPath, []byte(fmt.Sprintf(tpl, entry("key1", k1))), 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(newPath, []byte(fmt.Sprintf(tpl, entry("key2", k2)+entry("key1", k1))), 0o600); err != nil {
		return "", "", err
	}
	return oldPath, newPath, nil
}
