package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	flowcontrolbootstrap "k8s.io/apiserver/pkg/apis/flowcontrol/bootstrap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/verify"
)

// createWorkload creates, through the API, objects of many kinds in namespace
// ns, including DRA objects through resource.k8s.io/v1beta1.
func createWorkload(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	ctx := context.Background()
	must := func(what string, _ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("create %s: %v", what, err)
		}
	}
	var err error
	var o any
	o, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": "e2e"}}}, metav1.CreateOptions{})
	must("namespace", o, err)
	labels := map[string]string{"app": "web"}
	podSpec := corev1.PodSpec{Containers: []corev1.Container{{
		Name: "web", Image: "registry.k8s.io/pause:3.10",
		Ports:     []corev1.ContainerPort{{ContainerPort: 8080}},
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
	}}}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: podSpec}
	for i := 0; i < 3; i++ {
		o, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("config-%d", i), Annotations: map[string]string{"note": "ünïcode & <html>"}},
			Data:       map[string]string{"app.properties": fmt.Sprintf("color=blue\nreplicas=%d\n", i)},
			BinaryData: map[string][]byte{"blob": {0, 1, 2, 0xff}},
		}, metav1.CreateOptions{})
		must("configmap", o, err)
		o, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("secret-%d", i)},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{"password": []byte(fmt.Sprintf("not-a-real-password-%d", i))},
		}, metav1.CreateOptions{})
		must("secret", o, err)
	}
	o, err = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "web"}}, metav1.CreateOptions{})
	must("serviceaccount", o, err)
	o, err = cs.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	must("service", o, err)
	o, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Labels: labels}, Spec: podSpec}, metav1.CreateOptions{})
	must("pod", o, err)
	o, err = cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}, metav1.CreateOptions{})
	must("persistentvolumeclaim", o, err)
	o, err = cs.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{
		ObjectMeta: metav1.ObjectMeta{Name: "limits"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
			Type: corev1.LimitTypeContainer, Default: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
		}}},
	}, metav1.CreateOptions{})
	must("limitrange", o, err)
	o, err = cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: labels},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
	}, metav1.CreateOptions{})
	must("deployment", o, err)
	o, err = cs.AppsV1().StatefulSets(ns).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "db"},
		Spec:       appsv1.StatefulSetSpec{ServiceName: "web", Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
	}, metav1.CreateOptions{})
	must("statefulset", o, err)
	o, err = cs.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent"},
		Spec:       appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
	}, metav1.CreateOptions{})
	must("daemonset", o, err)
	jobTmpl := corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: podSpec.Containers}}
	o, err = cs.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "once"}, Spec: batchv1.JobSpec{Template: jobTmpl}}, metav1.CreateOptions{})
	must("job", o, err)
	o, err = cs.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly"},
		Spec:       batchv1.CronJobSpec{Schedule: "0 3 * * *", JobTemplate: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: jobTmpl}}},
	}, metav1.CreateOptions{})
	must("cronjob", o, err)
	o, err = cs.AutoscalingV2().HorizontalPodAutoscalers(ns).Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    ptr.To[int32](2), MaxReplicas: 5,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](70)},
			}}},
		},
	}, metav1.CreateOptions{})
	must("horizontalpodautoscaler", o, err)
	o, err = cs.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}},
	}, metav1.CreateOptions{})
	must("poddisruptionbudget", o, err)
	pathType := networkingv1.PathTypePrefix
	o, err = cs.NetworkingV1().Ingresses(ns).Create(ctx, &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{Host: "web.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
			Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &pathType, Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}}},
		}}}}},
	}, metav1.CreateOptions{})
	must("ingress", o, err)
	o, err = cs.NetworkingV1().NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny-all"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}, metav1.CreateOptions{})
	must("networkpolicy", o, err)
	o, err = cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
	}, metav1.CreateOptions{})
	must("role", o, err)
	o, err = cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "web", Namespace: ns}},
	}, metav1.CreateOptions{})
	must("rolebinding", o, err)
	o, err = cs.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: ns + "-high"}, Value: 1000}, metav1.CreateOptions{})
	must("priorityclass", o, err)

	// DRA, through resource.k8s.io/v1beta1.
	dra := cs.ResourceV1beta1()
	o, err = dra.DeviceClasses().Create(ctx, &resourcev1beta1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-gpu"},
		Spec: resourcev1beta1.DeviceClassSpec{Selectors: []resourcev1beta1.DeviceSelector{{CEL: &resourcev1beta1.CELDeviceSelector{
			Expression: `device.driver == "gpu.example.com"`}}}},
	}, metav1.CreateOptions{})
	must("deviceclass", o, err)
	req := resourcev1beta1.DeviceRequest{Name: "gpu", DeviceClassName: ns + "-gpu", AllocationMode: resourcev1beta1.DeviceAllocationModeExactCount, Count: 1}
	o, err = dra.ResourceClaims(ns).Create(ctx, &resourcev1beta1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-claim"},
		Spec:       resourcev1beta1.ResourceClaimSpec{Devices: resourcev1beta1.DeviceClaim{Requests: []resourcev1beta1.DeviceRequest{req}}},
	}, metav1.CreateOptions{})
	must("resourceclaim", o, err)
	o, err = dra.ResourceClaimTemplates(ns).Create(ctx, &resourcev1beta1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-template"},
		Spec: resourcev1beta1.ResourceClaimTemplateSpec{Spec: resourcev1beta1.ResourceClaimSpec{
			Devices: resourcev1beta1.DeviceClaim{Requests: []resourcev1beta1.DeviceRequest{req}}}},
	}, metav1.CreateOptions{})
	must("resourceclaimtemplate", o, err)
	o, err = dra.ResourceSlices().Create(ctx, &resourcev1beta1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-node-1-gpus"},
		Spec: resourcev1beta1.ResourceSliceSpec{
			Driver:   "gpu.example.com",
			Pool:     resourcev1beta1.ResourcePool{Name: "node-1", Generation: 1, ResourceSliceCount: 1},
			NodeName: "node-1",
			Devices: []resourcev1beta1.Device{{Name: "gpu-0", Basic: &resourcev1beta1.BasicDevice{
				Attributes: map[resourcev1beta1.QualifiedName]resourcev1beta1.DeviceAttribute{"model": {StringValue: ptr.To("A100")}},
				Capacity:   map[resourcev1beta1.QualifiedName]resourcev1beta1.DeviceCapacity{"memory": {Value: resource.MustParse("40Gi")}},
			}}},
		},
	}, metav1.CreateOptions{})
	must("resourceslice", o, err)
}

// versionStale are the resources kube-apiserver emulating 1.33 stores in a
// beta version and 1.37 in v1: DRA (resource.k8s.io/v1beta1, v1 since 1.34)
// and the service IP allocator's objects the apiserver itself writes
// (networking.k8s.io/v1beta1, v1 since 1.33, so not yet at min compatibility 1.32).
var versionStale = []string{
	"deviceclasses.resource.k8s.io",
	"ipaddresses.networking.k8s.io",
	"resourceclaims.resource.k8s.io",
	"resourceclaimtemplates.resource.k8s.io",
	"resourceslices.resource.k8s.io",
	"servicecidrs.networking.k8s.io",
}

// TestUpgrade133To137: objects written by kube-apiserver emulating 1.33 (DRA
// in resource.k8s.io/v1beta1) are migrated offline to what 1.37 stores, and a
// plain 1.37 kube-apiserver then serves every object with the same content and
// finds nothing to rewrite on a no-op update.
func TestUpgrade133To137(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	cfg := pipeline.Config{Prefix: "/registry"}

	// 1. kube-apiserver 1.37.2 (the in-process test server) emulating 1.33 with DRA (beta, off by default then) on.
	// Every server of this test runs API Priority and Fairness, as a real
	// cluster does: its bootstrap FlowSchemas and PriorityLevelConfigurations
	// (and their status, written by its configuration controller) are in etcd
	// when the tool runs, and in the no-op update of step 5.
	rc := c.start(apiservertest.Options{
		EmulatedVersion:     "1.33",
		FeatureGates:        "DynamicResourceAllocation=true",
		RuntimeConfig:       "resource.k8s.io/v1beta1=true",
		PriorityAndFairness: true,
	})
	createWorkload(t, kubernetes.NewForConfigOrDie(rc), "shop")
	createManagedFieldsVariety(t, rc, "shop")
	assertStoredAs(t, c.cli, "/registry/resourceclaims/shop/gpu-claim", "resource.k8s.io/v1beta1", "ResourceClaim", "under emulated 1.33")
	c.stop()

	// 2. A plain 1.37 server reads everything (reads do not rewrite): the reference content.
	rc = c.start(apiservertest.Options{PriorityAndFairness: true})
	gvrs := servedResources(t, rc)
	before := snapshot(t, rc, gvrs)
	t.Logf("%d objects served by 1.37 before the migration", len(before))
	// Reads do not run the field manager: 1.37 serves the managedFields
	// entries written through resource.k8s.io/v1beta1, which it no longer
	// serves, and its next write of each object drops them.
	dropped := droppedEntries(before, keptGroupVersions(t, rc))
	t.Logf("managedFields entries of unserved versions: %v", dropped)
	if dropped[schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}] < 4 {
		t.Fatalf("the DeviceClasses created through v1beta1 carry %d managedFields entries of it, want >= 4 (the test's premise)", dropped[schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}])
	}
	assertStoredAs(t, c.cli, "/registry/deviceclasses/shop-gpu", "resource.k8s.io/v1beta1", "DeviceClass", "after reads on 1.37")

	// kube-apiserver 1.37 itself rewrites a Job and a PVC it wrote on a
	// no-op update (defaulting on read changes them): so verify rightly
	// calls such objects stale.
	probeDefaultedOnRead(t, rc)

	// The migration refuses to run while a kube-apiserver is live (etcd shows
	// its identity lease renewed during the default window), and writes nothing.
	valueBefore, modBefore, _ := etcdValue(t, c.cli, "/registry/deviceclasses/shop-gpu")
	env := c.env(cfg)
	_, err := migrate.Run(ctx, env, migrate.Options{PreflightOptions: guard.PreflightOptions{QuotaBackendBytes: guard.DefaultQuotaBackendBytes}})
	env.Close()
	var pe *guard.PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "a kube-apiserver is alive") || !strings.Contains(err.Error(), "/registry/leases/kube-system/") {
		t.Fatalf("migrate with a live kube-apiserver: err = %v, want a preflight refusal naming its identity lease", err)
	}
	t.Logf("preflight refused as expected: %v", err)
	assertStoredAs(t, c.cli, "/registry/deviceclasses/shop-gpu", "resource.k8s.io/v1beta1", "DeviceClass", "after the refused migration")
	if valueAfter, modAfter, _ := etcdValue(t, c.cli, "/registry/deviceclasses/shop-gpu"); !bytes.Equal(valueAfter, valueBefore) || modAfter != modBefore {
		t.Fatalf("refused migration wrote /registry/deviceclasses/shop-gpu (mod revision %d -> %d)", modBefore, modAfter)
	}
	c.stop()

	// 3. verify: stale, exit 3, naming exactly the DRA resources.
	rep := c.verify(cfg)
	if code := rep.ExitCode(); code != 3 {
		t.Fatalf("verify exit %d before migrate, want 3 (summary %+v)", code, rep.Summary)
	}
	if got := staleResources(t, rep); !slices.Equal(got, versionStale) {
		t.Errorf("verify names stale resources %v, want %v", got, versionStale)
	}
	// The P&F bootstrap objects are in etcd, and the tool reads them.
	apf := apfBootstrapCounts(t, c.cli, cfg.Prefix)
	for gr, want := range apf {
		i := slices.IndexFunc(rep.Resources, func(r verify.ResourceReport) bool { return r.Group == gr.Group && r.Resource == gr.Resource })
		if i < 0 {
			t.Errorf("verify does not report %s (etcd holds %d)", gr, want)
		} else if got := rep.Resources[i].Objects; got != int64(want) {
			t.Errorf("verify reports %d %s, etcd holds %d", got, gr, want)
		}
	}
	// Besides their storage version, the DRA objects written through v1beta1
	// are stale by their managedFields, and verify says so.
	for _, r := range rep.Resources {
		if r.Name() == "deviceclasses.resource.k8s.io" && r.StaleBy[reencode.ReasonManagedFields] < 3 {
			t.Errorf("verify: deviceclasses stale by %v, want >= 3 by managed-fields", r.StaleBy)
		}
	}
	// Jobs, PVCs and StatefulSets are current in storage version and key,
	// but 1.37 defaults them on read (a Job's labels from its template, a
	// PVC's status.phase Pending, a StatefulSet field 1.33 did not have), so
	// re-encoding differs from the stored bytes and kube-apiserver rewrites
	// them on their next update, as shown above for Jobs and PVCs. verify
	// counts them as current-with-re-encode, not as stale.
	if got := reencodeResources(rep); !slices.Equal(got, []string{"jobs.batch", "persistentvolumeclaims", "statefulsets.apps"}) {
		t.Errorf("verify names re-encode-only resources %v, want [jobs.batch persistentvolumeclaims statefulsets.apps]", got)
	}

	// 4. migrate, then verify says current. migrate writes every object
	// whose bytes would change: the stale ones and the re-encode-only ones.
	sum := c.migrate(cfg)
	t.Logf("migrate: %+v", sum.Summary)
	if want := rep.Summary.Stale + rep.Summary.Reencode; sum.Summary.Rewritten != want {
		t.Errorf("migrate rewrote %d objects, verify found %d stale + %d to re-encode", sum.Summary.Rewritten, rep.Summary.Stale, rep.Summary.Reencode)
	}
	c.expectCurrent(cfg)
	assertStoredAs(t, c.cli, "/registry/deviceclasses/shop-gpu", "resource.k8s.io/v1", "DeviceClass", "after migrate")
	assertStoredAs(t, c.cli, "/registry/resourceslices/shop-node-1-gpus", "resource.k8s.io/v1", "ResourceSlice", "after migrate")

	// 5. plain 1.37 (resource.k8s.io/v1beta1 no longer served): same content,
	// managedFields as its field manager leaves them, and no object of any
	// resource is rewritten by a no-op update.
	rc = c.start(apiservertest.Options{PriorityAndFairness: true})
	sameContent(t, rc, before)
	byResource := noOpUpdatesByResource(t, rc)
	t.Logf("no-op update of %d objects", total(byResource))
	for gr, want := range apf {
		if byResource[gr] < want {
			t.Errorf("the no-op update covered %d %s, etcd held %d when the tool ran", byResource[gr], gr, want)
		}
	}
	t.Logf("no-op update covered P&F bootstrap objects: %d flowschemas, %d prioritylevelconfigurations",
		byResource[flowSchemas], byResource[priorityLevels])
}

var (
	flowSchemas    = schema.GroupResource{Group: "flowcontrol.apiserver.k8s.io", Resource: "flowschemas"}
	priorityLevels = schema.GroupResource{Group: "flowcontrol.apiserver.k8s.io", Resource: "prioritylevelconfigurations"}
)

// apfBootstrapCounts counts the FlowSchemas and PriorityLevelConfigurations
// in etcd, and fails the test unless every bootstrap object kube-apiserver
// ensures (k8s.io/apiserver's flowcontrol bootstrap lists) is among them.
func apfBootstrapCounts(t *testing.T, cli *clientv3.Client, prefix string) map[schema.GroupResource]int {
	t.Helper()
	ctx := context.Background()
	out := map[schema.GroupResource]int{}
	for gr, names := range map[schema.GroupResource][]string{
		flowSchemas:    bootstrapNames(flowcontrolbootstrap.MandatoryFlowSchemas, flowcontrolbootstrap.SuggestedFlowSchemas),
		priorityLevels: bootstrapNames(flowcontrolbootstrap.MandatoryPriorityLevelConfigurations, flowcontrolbootstrap.SuggestedPriorityLevelConfigurations),
	} {
		dir := prefix + "/" + gr.Resource + "/"
		resp, err := cli.Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatalf("etcd get %s: %v", dir, err)
		}
		have := map[string]bool{}
		for _, kv := range resp.Kvs {
			have[strings.TrimPrefix(string(kv.Key), dir)] = true
		}
		for _, name := range names {
			if !have[name] {
				t.Fatalf("P&F bootstrap object %s%s is not in etcd", dir, name)
			}
		}
		out[gr] = len(resp.Kvs)
	}
	t.Logf("P&F objects in etcd: %d flowschemas, %d prioritylevelconfigurations", out[flowSchemas], out[priorityLevels])
	return out
}

func total[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func bootstrapNames[T metav1.Object](lists ...[]T) []string {
	var out []string
	for _, l := range lists {
		for _, o := range l {
			out = append(out, o.GetName())
		}
	}
	return out
}

// probeDefaultedOnRead creates a Job and a PVC through a running 1.37 server
// and shows that a no-op update of either is written.
func probeDefaultedOnRead(t *testing.T, rc *rest.Config) {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(rc)
	cs := kubernetes.NewForConfigOrDie(rc)
	if _, err := cs.BatchV1().Jobs("default").Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: batchv1.JobSpec{
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Spec: corev1.PersistentVolumeClaimSpec{
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, gvr := range []schema.GroupVersionResource{{Group: "batch", Version: "v1", Resource: "jobs"}, {Version: "v1", Resource: "persistentvolumeclaims"}} {
		ri := dyn.Resource(gvr).Namespace("default")
		got, err := ri.Get(ctx, "probe", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		upd, err := ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
		if err != nil {
			t.Fatal(err)
		}
		if upd.GetResourceVersion() == got.GetResourceVersion() {
			t.Errorf("%s default/probe: kube-apiserver 1.37 did not rewrite it on a no-op update; the test's premise is wrong", gvr.Resource)
		}
	}
}
