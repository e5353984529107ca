package updatepath

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/kubernetes/pkg/apis/apps"
	"k8s.io/kubernetes/pkg/apis/autoscaling"
	api "k8s.io/kubernetes/pkg/apis/core"
	"k8s.io/kubernetes/pkg/apis/resource"
)

// corpusKind is one kind of the differential corpus: its objects, and the
// apiVersions and field sets its managedFields entries are drawn from.
type corpusKind struct {
	name     string
	versions []string // served (first: preferred), unserved, unknown, malformed
	fields   []string // valid, unknown fields, metadata, atomic-vs-granular, invalid JSON
	object   func(r *rand.Rand, i int) runtime.Object
}

var corpusKinds = []corpusKind{
	{
		name:     "secret",
		versions: []string{"v1", "v1", "v1beta1", "apps/v1", "a/b/c", ""},
		fields: []string{`{"f:data":{".":{},"f:a":{}},"f:type":{}}`, `{"f:data":{"f:b":{}}}`, `{"f:metadata":{"f:labels":{"f:x":{}}}}`,
			`{"f:nonexistent":{}}`, `{"f:metadata":{"f:managedFields":{}}}`, `{}`, `{"f:data":`, `{"f:type":{},"f:immutable":{}}`},
		object: func(r *rand.Rand, i int) runtime.Object {
			return &api.Secret{ObjectMeta: objectMeta(r, i), Type: api.SecretTypeOpaque, Data: map[string][]byte{"a": []byte(fmt.Sprint(r.Int())), "b": []byte("x")}}
		},
	},
	{
		name:     "pod",
		versions: []string{"v1", "v1", "v2", "apps/v1"},
		fields: []string{`{"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:image":{},"f:name":{},"f:env":{"k:{\"name\":\"A\"}":{".":{},"f:name":{},"f:value":{}}}}}}}`,
			`{"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":{".":{},"f:status":{},"f:type":{}}},"f:podIP":{}}}`,
			`{"f:spec":{"f:containers":{"v:\"app\"":{}}}}`, `{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}}}}`,
			`{"f:spec":{"f:tolerations":{}}}`, `{"f:spec":{"f:nodeName":{}}}`},
		object: func(r *rand.Rand, i int) runtime.Object {
			env := []api.EnvVar{{Name: "A", Value: fmt.Sprint(r.Intn(3))}}
			if r.Intn(4) == 0 {
				env = append(env, api.EnvVar{Name: "A", Value: "dup"}) // a duplicate key: allowed in the request version
			}
			return &api.Pod{ObjectMeta: objectMeta(r, i), Spec: api.PodSpec{Containers: []api.Container{{Name: "app", Image: "img:" + fmt.Sprint(r.Intn(5)), Env: env}}},
				Status: api.PodStatus{PodIP: fmt.Sprintf("10.0.%d.%d", r.Intn(255), r.Intn(255)), Conditions: []api.PodCondition{{Type: api.PodReady, Status: api.ConditionTrue}}}}
		},
	},
	{
		name:     "deployment",
		versions: []string{"apps/v1", "apps/v1", "extensions/v1beta1", "apps/v1beta2", "apps/v1beta1"},
		fields: []string{`{"f:spec":{"f:replicas":{},"f:selector":{},"f:template":{"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:image":{}}}}}}}`,
			`{"f:status":{"f:replicas":{},"f:conditions":{".":{},"k:{\"type\":\"Available\"}":{".":{},"f:type":{}}}}}`,
			`{"f:spec":{"f:replicas":{}}}`, `{"f:spec":{"f:selector":{"f:matchLabels":{"f:app":{}}}}}`},
		object: func(r *rand.Rand, i int) runtime.Object {
			return &apps.Deployment{ObjectMeta: objectMeta(r, i), Spec: apps.DeploymentSpec{Replicas: int32(r.Intn(4)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
				Template: api.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "a"}}, Spec: api.PodSpec{Containers: []api.Container{{Name: "app", Image: "img"}}}}}}
		},
	},
	{
		// Served in two versions: entries of autoscaling/v1 are compared in v1.
		name:     "hpa",
		versions: []string{"autoscaling/v2", "autoscaling/v1", "autoscaling/v2beta2", "autoscaling/v2beta1"},
		fields: []string{`{"f:spec":{"f:maxReplicas":{},"f:minReplicas":{},"f:scaleTargetRef":{}}}`, `{"f:spec":{"f:targetCPUUtilizationPercentage":{}}}`,
			`{"f:spec":{"f:metrics":{}}}`, `{"f:status":{"f:currentReplicas":{}}}`},
		object: func(r *rand.Rand, i int) runtime.Object {
			return &autoscaling.HorizontalPodAutoscaler{ObjectMeta: objectMeta(r, i), Spec: autoscaling.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscaling.CrossVersionObjectReference{Kind: "Deployment", Name: "d", APIVersion: "apps/v1"}, MaxReplicas: int32(2 + r.Intn(3))}}
		},
	},
	{
		// With --runtime-config resource.k8s.io/v1beta2=true served in two
		// versions, and the other betas not: a duplicate reservedFor UID
		// makes the typed value in v1beta2 (duplicates refused there) fail,
		// content the key does not hold.
		name:     "resourceclaim",
		versions: []string{"resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1", "resource.k8s.io/v1alpha3"},
		fields: []string{`{"f:spec":{"f:devices":{"f:requests":{}}}}`, `{"f:status":{"f:reservedFor":{"k:{\"uid\":\"u1\"}":{".":{},"f:name":{},"f:resource":{},"f:uid":{}}}}}`,
			`{"f:spec":{"f:devices":{}}}`},
		object: func(r *rand.Rand, i int) runtime.Object {
			rc := &resource.ResourceClaim{ObjectMeta: objectMeta(r, i), Spec: resource.ResourceClaimSpec{Devices: resource.DeviceClaim{Requests: []resource.DeviceRequest{{Name: "gpu", Exactly: &resource.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resource.DeviceAllocationModeExactCount, Count: 1}}}}}}
			rc.Status.ReservedFor = []resource.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "u1"}}
			if r.Intn(3) == 0 {
				rc.Status.ReservedFor = append(rc.Status.ReservedFor, resource.ResourceClaimConsumerReference{Resource: "pods", Name: "q", UID: "u1"})
			}
			return rc
		},
	},
}

var corpusManagers = []string{"kubectl-create", "kubectl", "kubectl-client-side-apply", "kube-controller-manager", "kubelet", "helm", "argocd", "operator",
	"m8", "m9", "m10", "m11", "m12", "m13", "before-first-apply", "ancient-changes"}

func objectMeta(r *rand.Rand, i int) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Name: fmt.Sprintf("o-%d", i), Namespace: "ns", ResourceVersion: "9", Generation: 1,
		CreationTimestamp: metav1.NewTime(time.Unix(1700000000, 0))}
	if r.Intn(10) != 0 {
		m.UID = types.UID(fmt.Sprintf("uid-%d", i))
	}
	if r.Intn(3) == 0 {
		m.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"apiVersion":"v1","kind":"X","metadata":{"name":"o"}}`}
	}
	return m
}

// shape is a managedFields list of the corpus with its times as seconds
// (-1: nil), shared by many objects.
type shape struct {
	entries []metav1.ManagedFieldsEntry
	secs    []int64
}

func randomShape(r *rand.Rand, k corpusKind) shape {
	var n int
	switch x := r.Intn(20); {
	case x < 9:
		n = 1
	case x < 14:
		n = 2 + r.Intn(3)
	default:
		n = 10 + r.Intn(5) // more than ten update managers: ancient-changes merging
	}
	var s shape
	// Most shapes as kube-apiserver writes them: entries of the preferred
	// version, decodable, sorted; the rest anything.
	clean := r.Intn(10) < 6
	if clean {
		n = min(n, 6)
	}
	if !clean && r.Intn(15) == 0 {
		// One empty entry: a reset.
		return shape{entries: []metav1.ManagedFieldsEntry{{}}, secs: []int64{-1}}
	}
	for j := 0; j < n; j++ {
		e := metav1.ManagedFieldsEntry{Manager: corpusManagers[r.Intn(len(corpusManagers))], Operation: metav1.ManagedFieldsOperationUpdate, FieldsType: "FieldsV1"}
		if clean {
			e.Manager = corpusManagers[j]
		}
		if n > 1 && n < 10 && r.Intn(4) == 0 {
			e.Operation = metav1.ManagedFieldsOperationApply
		}
		if !clean && r.Intn(20) == 0 {
			e.Operation = "Patch"
		}
		// Mostly the preferred version; the others now and then.
		if !clean && r.Intn(2) == 0 {
			e.APIVersion = k.versions[r.Intn(len(k.versions))]
		} else {
			e.APIVersion = k.versions[0]
		}
		if !clean && r.Intn(8) == 0 {
			e.Subresource = []string{"status", "scale"}[r.Intn(2)]
		}
		switch r.Intn(30) {
		case 0:
			e.FieldsType = ""
		case 1:
			e.FieldsType = "FieldsV2"
		}
		if clean {
			e.FieldsType = "FieldsV1"
		}
		switch {
		case clean:
			e.FieldsV1 = metav1.NewFieldsV1(k.fields[r.Intn(2)])
		case r.Intn(10) != 0:
			e.FieldsV1 = metav1.NewFieldsV1(k.fields[r.Intn(len(k.fields))])
		}
		s.entries = append(s.entries, e)
		sec := int64(1000 + 10*r.Intn(4))
		if !clean && r.Intn(15) == 0 {
			sec = -1
		}
		s.secs = append(s.secs, sec)
	}
	if clean || r.Intn(2) == 0 {
		// As kube-apiserver writes them: sorted, so that the field manager
		// changes nothing on many of them.
		s = sortedShape(s)
	}
	return s
}

// sorted orders a shape's entries as the field manager's encoder does.
func sortedShape(s shape) shape {
	idx := make([]int, len(s.entries))
	for i := range idx {
		idx[i] = i
	}
	less := func(a, b int) bool {
		p, q := s.entries[idx[a]], s.entries[idx[b]]
		if p.Operation != q.Operation {
			return p.Operation < q.Operation
		}
		ps, qs := max(s.secs[idx[a]], 0), max(s.secs[idx[b]], 0)
		if ps != qs {
			return ps < qs
		}
		if p.Manager != q.Manager {
			return p.Manager < q.Manager
		}
		if p.APIVersion != q.APIVersion {
			return p.APIVersion < q.APIVersion
		}
		return p.Subresource < q.Subresource
	}
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && less(j, j-1); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	out := shape{}
	for _, i := range idx {
		out.entries = append(out.entries, s.entries[i])
		out.secs = append(out.secs, s.secs[i])
	}
	return out
}

// instance gives an object the shape's entries, its times shifted by the
// object's offset (the order kept) and, now and then, one time moved (the
// order possibly changed).
func (s shape) instance(r *rand.Rand) []metav1.ManagedFieldsEntry {
	offset := int64(r.Intn(5)) * 100000
	out := make([]metav1.ManagedFieldsEntry, len(s.entries))
	moved := -1
	if r.Intn(6) == 0 {
		moved = r.Intn(len(s.entries))
	}
	for i, e := range s.entries {
		e.FieldsV1 = nil
		if s.entries[i].FieldsV1 != nil {
			e.FieldsV1 = metav1.NewFieldsV1(s.entries[i].FieldsV1.GetRawString())
		}
		if sec := s.secs[i]; sec >= 0 {
			if i == moved {
				sec += int64(r.Intn(41)) - 20
			}
			t := metav1.NewTime(time.Unix(offset+sec, int64(r.Intn(3))*1000).UTC())
			e.Time = &t
		}
		out[i] = e
	}
	return out
}

// TestShortcutDifferential runs a generated corpus of objects through the
// field manager of a no-op update twice, each object on its own copy: with
// the shortcut (Memo) and with --full-field-manager (kube-apiserver's
// UpdateNoErrors on every object), and asserts that both give the same
// object, byte for byte, and the same verdict. The corpus has Secrets, Pods,
// Deployments, HorizontalPodAutoscalers (served in two versions) and
// ResourceClaims (two versions with --runtime-config) with managedFields
// drawn from shapes many objects share: one to fourteen managers (over ten
// update managers merge into ancient-changes), Apply and Update operations,
// entries of served, unserved, unknown and malformed versions, subresources,
// field sets of unknown fields, invalid JSON, no fieldsV1, wrong fieldsType
// or operation, a lone empty entry, times that keep or change the entries'
// order, no time; objects with and without UID and last-applied annotation,
// duplicate keys in lists (the field manager fails on some of them, when an
// entry's version refuses duplicates).
func TestShortcutDifferential(t *testing.T) {
	for _, rc := range [][]string{nil, {"resource.k8s.io/v1beta2=true"}} {
		t.Run(fmt.Sprint(rc), func(t *testing.T) {
			p := path(t, rc...)
			r := rand.New(rand.NewSource(19))
			var shapes [][]shape
			for _, k := range corpusKinds {
				var ss []shape
				for j := 0; j < 40; j++ {
					ss = append(ss, randomShape(r, k))
				}
				shapes = append(shapes, ss)
			}
			var objects, hits, changed, failed, panics int
			for i := 0; i < 4000; i++ {
				ki := r.Intn(len(corpusKinds))
				k := corpusKinds[ki]
				// Zipf-like: the first shapes are the most common.
				s := shapes[ki][int(float64(len(shapes[ki]))*r.Float64()*r.Float64())]
				obj := k.object(r, i)
				acc, _ := metaAccessor(obj)
				acc.SetManagedFields(s.instance(r))
				short, full := obj.DeepCopyObject(), obj.DeepCopyObject()

				p.cfg.FullFieldManager = true
				fullChanged, fullErr := p.Apply(full)
				p.cfg.FullFieldManager = false
				gk := kindOf(p.scheme(short), short).GroupKind().String()
				sacc, _ := metaAccessor(short)
				key := p.memo.Key(gk, sacc.GetUID() != "", sacc.GetManagedFields())
				known := key.Known()
				key.Done()
				if !known {
					// What the shortcut's own run of the field manager says (on a copy).
					probe := obj.DeepCopyObject()
					pacc, _ := metaAccessor(probe)
					fm, _ := p.manager(kindOf(p.scheme(probe), probe).GroupKind(), probe)
					if fm != nil && probeFails(fm, probe, pacc) {
						failed++
					}
				}
				shortChanged, shortErr := p.Apply(short)
				if (shortErr == nil) != (fullErr == nil) {
					t.Fatalf("object %d (%s): error %v with the shortcut, %v with the full field manager", i, k.name, shortErr, fullErr)
				}
				objects++
				if fullErr != nil {
					panics++
					continue
				}
				if known {
					hits++
				}
				if fullChanged {
					changed++
				}
				if shortChanged != fullChanged {
					t.Fatalf("object %d (%s, %d entries): changed=%v with the shortcut (memo hit %v), %v with the full field manager", i, k.name, len(s.entries), shortChanged, known, fullChanged)
				}
				if !reflect.DeepEqual(short, full) {
					a, _ := json.Marshal(short)
					b, _ := json.Marshal(full)
					t.Fatalf("object %d (%s, memo hit %v): differs\nshortcut: %s\nfull:     %s", i, k.name, known, a, b)
				}
				a, _ := json.Marshal(short)
				b, _ := json.Marshal(full)
				if string(a) != string(b) {
					t.Fatalf("object %d (%s): JSON differs", i, k.name)
				}
			}
			t.Logf("%d objects: %d memo hits, %d changed by the field manager, %d misses where it failed, %d where it panicked", objects, hits, changed, failed, panics)
			// The corpus must exercise what it claims to.
			if hits < objects/3 || changed < objects/20 || changed > objects*3/5 {
				t.Errorf("corpus too uniform: %d objects, %d hits, %d changed", objects, hits, changed)
			}
			if rc != nil && failed == 0 {
				t.Errorf("no object made the field manager fail")
			}
		})
	}
}

func metaAccessor(obj runtime.Object) (metav1.Object, error) {
	o, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return o, nil
}

// probeFails runs the shortcut's own field manager call on obj and says
// whether it failed (a panic counts).
func probeFails(fm *managedfields.FieldManager, obj runtime.Object, acc metav1.Object) (failed bool) {
	defer func() {
		if recover() != nil {
			failed = true
		}
	}()
	_, failed = update(fm, obj, acc, acc.GetManagedFields())
	return failed
}

// TestCheckShortcut: with Config.CheckShortcut (the e2e tests' hook) an
// object on which the shortcut and the full field manager differ is an
// error; where they agree it is not.
func TestCheckShortcut(t *testing.T) {
	p := path(t)
	p.cfg.CheckShortcut = true
	mk := func() *resource.DeviceClass {
		return deviceClass(entry("kubectl-client-side-apply", "resource.k8s.io/v1beta1", selectorsFields), entry("operator", "resource.k8s.io/v1", selectorsFields))
	}
	if changed, err := p.Apply(mk()); err != nil || !changed {
		t.Fatalf("changed=%v err=%v: the v1beta1 entry is dropped, both ways", changed, err)
	}
	kept := deviceClass(entry("operator", "resource.k8s.io/v1", selectorsFields))
	for i := 0; i < 2; i++ {
		if changed, err := p.Apply(kept.DeepCopy()); err != nil || changed {
			t.Fatalf("run %d: changed=%v err=%v", i, changed, err)
		}
	}
	// A wrong memo: the object whose entry is dropped remembered as unchanged.
	dc := mk()
	key := p.memo.Key(schema.GroupKind{Group: "resource.k8s.io", Kind: "DeviceClass"}.String(), true, dc.ManagedFields)
	key.Remember()
	key.Done()
	if _, err := p.Apply(dc); err == nil || !strings.Contains(err.Error(), "shortcut") {
		t.Errorf("a wrong shortcut went unnoticed: err=%v", err)
	}
}
