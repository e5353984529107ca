package seed

import (
	"fmt"
	"time"

	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/pkg/apis/apps"
	"k8s.io/kubernetes/pkg/apis/coordination"
	api "k8s.io/kubernetes/pkg/apis/core"
	resourceapi "k8s.io/kubernetes/pkg/apis/resource"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
)

// appNames are the workloads of every team namespace.
var appNames = []string{"frontend", "api", "worker", "cache", "billing", "search"}

// teamsPerScale is the number of team namespaces per unit of Options.Scale.
const teamsPerScale = 4

func meta(ns, name string, age time.Duration) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              name,
		Namespace:         ns,
		UID:               types.UID(uid(ns, name)),
		CreationTimestamp: metav1.NewTime(baseTime.Add(age)),
	}
}

func (w *writer) cluster(scale int, res *Result) error {
	// System namespaces and the (stopped) kube-apiserver's identity lease.
	for _, ns := range []string{"default", "kube-system"} {
		if err := w.namespace(ns); err != nil {
			return err
		}
	}
	if err := w.apiserverLease(); err != nil {
		return err
	}
	// A bootstrap secret from before encryption at rest was enabled: identity.
	if _, err := w.builtin(grSecrets, "kube-system", "bootstrap-legacy", &api.Secret{
		ObjectMeta: meta("kube-system", "bootstrap-legacy", 0),
		Type:       api.SecretTypeOpaque,
		Data:       map[string][]byte{"token": []byte(suffix(32, "bootstrap-legacy"))},
	}, how{plaintext: true}); err != nil {
		return err
	}

	for t := 0; t < teamsPerScale*scale; t++ {
		ns := fmt.Sprintf("team-%02d", t)
		// Every fourth team namespace was written by an apiserver run with
		// --storage-media-type=application/json (configmaps and deployments).
		media := ""
		if t%teamsPerScale == teamsPerScale-1 {
			media = decode.MediaTypeJSON
		}
		if err := w.namespace(ns); err != nil {
			return err
		}
		for i, app := range appNames {
			key, err := w.app(ns, app, t*len(appNames)+i, media)
			if err != nil {
				return err
			}
			if res.SecretKey == "" {
				res.SecretKey = key
			}
		}
	}
	if err := w.deviceClasses(); err != nil {
		return err
	}
	return w.widgets(scale)
}

// namespace writes a namespace with its default service account and root CA configmap.
func (w *writer) namespace(ns string) error {
	m := meta("", ns, 0)
	m.Labels = map[string]string{"kubernetes.io/metadata.name": ns}
	if _, err := w.builtin(grNamespaces, "", ns, &api.Namespace{
		ObjectMeta: m,
		Spec:       api.NamespaceSpec{Finalizers: []api.FinalizerName{api.FinalizerKubernetes}},
		Status:     api.NamespaceStatus{Phase: api.NamespaceActive},
	}, how{}); err != nil {
		return err
	}
	if _, err := w.builtin(grServiceAccounts, ns, "default", &api.ServiceAccount{ObjectMeta: meta(ns, "default", time.Second)}, how{}); err != nil {
		return err
	}
	ca := meta(ns, "kube-root-ca.crt", time.Second)
	ca.Annotations = map[string]string{"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}
	_, err := w.builtin(grConfigMaps, ns, "kube-root-ca.crt", &api.ConfigMap{
		ObjectMeta: ca,
		Data:       map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\nMIIC/jCCAeagAwIBAgIBADANBgkqhkiG9w0BAQsFADAVMRMwEQYDVQQDEwprdWJl\ncm5ldGVzMB4XDTI1MDMwMzA5MDAwMFoXDTM1MDMwMTA5MDAwMFowFTETMBEGA1UE\n-----END CERTIFICATE-----\n"},
	}, how{})
	return err
}

func (w *writer) apiserverLease() error {
	name := "apiserver-" + suffix(26, "apiserver")
	m := meta("kube-system", name, 0)
	m.Labels = map[string]string{"apiserver.kubernetes.io/identity": "kube-apiserver", "kubernetes.io/hostname": "control-plane-0"}
	holder := name + "_" + uid("holder")
	dur := int32(3600)
	renew := metav1.NewMicroTime(baseTime.Add(72 * time.Hour))
	_, err := w.builtin(grLeases, "kube-system", name, &coordination.Lease{
		ObjectMeta: m,
		Spec:       coordination.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &dur, AcquireTime: &renew, RenewTime: &renew},
	}, how{})
	return err
}

// app writes one workload: service account, configmap, secret, service, deployment,
// replica set, two pods and their events. It returns the secret's key.
func (w *writer) app(ns, app string, n int, media string) (string, error) {
	age := time.Duration(n) * time.Minute
	labels := map[string]string{"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": ns}

	if _, err := w.builtin(grServiceAccounts, ns, app, &api.ServiceAccount{ObjectMeta: meta(ns, app, age)}, how{}); err != nil {
		return "", err
	}
	cm := meta(ns, app+"-config", age)
	cm.Labels = labels
	if _, err := w.builtin(grConfigMaps, ns, app+"-config", &api.ConfigMap{
		ObjectMeta: cm,
		Data: map[string]string{
			"LOG_LEVEL":   "info",
			"LISTEN_ADDR": ":8080",
			"app.yaml":    fmt.Sprintf("name: %s\nreplicas: 2\nfeatures:\n  cache: %t\n  tracing: true\n", app, n%2 == 0),
		},
	}, how{media: media}); err != nil {
		return "", err
	}
	sm := meta(ns, app+"-credentials", age)
	sm.Labels = labels
	secretKey, err := w.builtin(grSecrets, ns, app+"-credentials", &api.Secret{
		ObjectMeta: sm,
		Type:       api.SecretTypeOpaque,
		Data: map[string][]byte{
			"username": []byte(app),
			"password": []byte(suffix(24, ns, app, "password")),
		},
	}, how{})
	if err != nil {
		return "", err
	}

	single := api.IPFamilyPolicySingleStack
	clusterPolicy := api.ServiceInternalTrafficPolicyCluster
	ip := fmt.Sprintf("10.96.%d.%d", 1+n/250, 1+n%250)
	sv := meta(ns, app, age)
	sv.Labels = labels
	if _, err := w.builtin(grServices, ns, app, &api.Service{
		ObjectMeta: sv,
		Spec: api.ServiceSpec{
			Type:                  api.ServiceTypeClusterIP,
			ClusterIP:             ip,
			ClusterIPs:            []string{ip},
			IPFamilies:            []api.IPFamily{api.IPv4Protocol},
			IPFamilyPolicy:        &single,
			InternalTrafficPolicy: &clusterPolicy,
			Selector:              map[string]string{"app.kubernetes.io/name": app},
			Ports:                 []api.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: api.ProtocolTCP}},
			SessionAffinity:       api.ServiceAffinityNone,
		},
	}, how{}); err != nil {
		return "", err
	}

	template := api.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: api.PodSpec{
			ServiceAccountName: app,
			Containers: []api.Container{{
				Name:  app,
				Image: fmt.Sprintf("registry.example.com/%s/%s:1.%d.0", ns, app, n%7),
				Ports: []api.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: api.ProtocolTCP}},
				EnvFrom: []api.EnvFromSource{
					{ConfigMapRef: &api.ConfigMapEnvSource{LocalObjectReference: api.LocalObjectReference{Name: app + "-config"}}},
					{SecretRef: &api.SecretEnvSource{LocalObjectReference: api.LocalObjectReference{Name: app + "-credentials"}}},
				},
				Resources: api.ResourceRequirements{
					Requests: api.ResourceList{api.ResourceCPU: resource.MustParse("100m"), api.ResourceMemory: resource.MustParse("128Mi")},
					Limits:   api.ResourceList{api.ResourceMemory: resource.MustParse("256Mi")},
				},
			}},
		},
	}
	replicas := int32(2)
	selector := &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": app}}
	dm := meta(ns, app, age)
	dm.Labels = labels
	dm.Generation = 1
	dm.Annotations = map[string]string{"deployment.kubernetes.io/revision": "1"}
	deploy := &apps.Deployment{
		ObjectMeta: dm,
		Spec:       apps.DeploymentSpec{Replicas: replicas, Selector: selector, Template: template},
		Status:     apps.DeploymentStatus{ObservedGeneration: 1, Replicas: replicas, UpdatedReplicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas},
	}
	if _, err := w.builtin(grDeployments, ns, app, deploy, how{media: media}); err != nil {
		return "", err
	}

	hash := suffix(10, ns, app, "pod-template-hash")
	rsName := app + "-" + hash
	rsLabels := map[string]string{"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": ns, "pod-template-hash": hash}
	rsTemplate := *template.DeepCopy()
	rsTemplate.Labels = rsLabels
	rm := meta(ns, rsName, age)
	rm.Labels = rsLabels
	rm.Generation = 1
	rm.OwnerReferences = []metav1.OwnerReference{owner("apps/v1", "Deployment", app, dm.UID)}
	if _, err := w.builtin(grReplicaSets, ns, rsName, &apps.ReplicaSet{
		ObjectMeta: rm,
		Spec: apps.ReplicaSetSpec{
			Replicas: replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": app, "pod-template-hash": hash}},
			Template: rsTemplate,
		},
		Status: apps.ReplicaSetStatus{Replicas: replicas, FullyLabeledReplicas: replicas, ReadyReplicas: replicas, AvailableReplicas: replicas, ObservedGeneration: 1},
	}, how{}); err != nil {
		return "", err
	}

	for p := 0; p < int(replicas); p++ {
		podName := rsName + "-" + suffix(5, ns, rsName, fmt.Sprint(p))
		pm := meta(ns, podName, age+time.Second)
		pm.Labels = rsLabels
		pm.OwnerReferences = []metav1.OwnerReference{owner("apps/v1", "ReplicaSet", rsName, rm.UID)}
		spec := *rsTemplate.Spec.DeepCopy()
		node := fmt.Sprintf("worker-%d", (n+p)%3)
		spec.NodeName = node
		started := metav1.NewTime(baseTime.Add(age + 2*time.Second))
		pod := &api.Pod{
			ObjectMeta: pm,
			Spec:       spec,
			Status: api.PodStatus{
				Phase:     api.PodRunning,
				HostIPs:   []api.HostIP{{IP: fmt.Sprintf("192.168.0.%d", 10+(n+p)%3)}},
				PodIPs:    []api.PodIP{{IP: fmt.Sprintf("10.244.%d.%d", (n+p)%3, 2+n%250)}},
				StartTime: &started,
				QOSClass:  api.PodQOSBurstable,
				Conditions: []api.PodCondition{
					{Type: api.PodScheduled, Status: api.ConditionTrue, LastTransitionTime: started},
					{Type: api.PodReady, Status: api.ConditionTrue, LastTransitionTime: started},
				},
			},
		}
		if _, err := w.builtin(grPods, ns, podName, pod, how{}); err != nil {
			return "", err
		}
		for e, ev := range []struct{ reason, component, message string }{
			{"Scheduled", "default-scheduler", fmt.Sprintf("Successfully assigned %s/%s to %s", ns, podName, node)},
			{"Started", "kubelet", "Started container " + app},
		} {
			evName := fmt.Sprintf("%s.%s", podName, suffix(16, podName, ev.reason))
			ts := metav1.NewTime(baseTime.Add(age + time.Duration(2+e)*time.Second))
			if _, err := w.builtin(grEvents, ns, evName, &api.Event{
				ObjectMeta:          meta(ns, evName, age+time.Duration(2+e)*time.Second),
				InvolvedObject:      api.ObjectReference{Kind: "Pod", Namespace: ns, Name: podName, UID: pm.UID, APIVersion: "v1"},
				Reason:              ev.reason,
				Message:             ev.message,
				Source:              api.EventSource{Component: ev.component, Host: node},
				FirstTimestamp:      ts,
				LastTimestamp:       ts,
				Count:               1,
				Type:                api.EventTypeNormal,
				ReportingController: ev.component,
			}, how{event: true}); err != nil {
				return "", err
			}
		}
	}
	return secretKey, nil
}

func owner(apiVersion, kind, name string, id types.UID) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: id, Controller: &yes, BlockOwnerDeletion: &yes}
}

// deviceClasses writes DRA DeviceClasses as older apiservers stored them; 1.37 stores
// resource.k8s.io/v1. Two as kube-apiserver 1.33 (DRA beta, resource.k8s.io/v1beta1
// enabled) stored them: v1beta1, as e2e.TestAPIServerEmulatedStorageVersion observed
// on a real kube-apiserver emulating 1.33. Two written by 1.34: v1beta2.
func (w *writer) deviceClasses() error {
	for i, dc := range []struct {
		name string
		h    how
	}{
		{"gpu.example.com", how{version: resourcev1beta1.SchemeGroupVersion}},
		{"fpga.example.com", how{version: resourcev1beta1.SchemeGroupVersion}},
		{"nic.example.com", how{emulated: "1.34"}},
		{"tpu.example.com", how{emulated: "1.34"}},
	} {
		m := meta("", dc.name, time.Duration(i)*time.Hour)
		m.Generation = 1
		if _, err := w.builtin(grDeviceClasses, "", dc.name, &resourceapi.DeviceClass{
			ObjectMeta: m,
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", dc.name)}}},
			},
		}, dc.h); err != nil {
			return err
		}
	}
	return nil
}

// WidgetCRD returns the CRD widgets.example.com as it is now: served at v1beta1 and
// v1, stored at v1, status.storedVersions [v1beta1, v1], conversion None.
func WidgetCRD() *apiextensionsv1.CustomResourceDefinition {
	schemaFor := func() *apiextensionsv1.CustomResourceValidation {
		return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"spec": {
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"size":  {Type: "integer"},
						"color": {Type: "string"},
						"tier":  {Type: "string", Default: &apiextensionsv1.JSON{Raw: []byte(`"standard"`)}},
					},
				},
				"status": {
					Type:       "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{"ready": {Type: "boolean"}},
				},
			},
		}}
	}
	names := apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ListKind: "WidgetList"}
	m := meta("", "widgets.example.com", 0)
	m.Generation = 2
	established := metav1.NewTime(baseTime)
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: m,
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: names,
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1beta1", Served: true, Storage: false, Schema: schemaFor(), Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}},
				{Name: "v1", Served: true, Storage: true, Schema: schemaFor(), Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
		},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{
			AcceptedNames:  names,
			StoredVersions: []string{"v1beta1", "v1"},
			Conditions: []apiextensionsv1.CustomResourceDefinitionCondition{
				{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionTrue, Reason: "NoConflicts", Message: "no conflicts found", LastTransitionTime: established},
				{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue, Reason: "InitialNamesAccepted", Message: "the initial names have been accepted", LastTransitionTime: established},
			},
		},
	}
}

// oldWidgetCRD is WidgetCRD before its storage version moved: stored at v1beta1.
func oldWidgetCRD() *apiextensionsv1.CustomResourceDefinition {
	crd := WidgetCRD()
	crd.Spec.Versions[0].Storage = true
	crd.Spec.Versions[1].Storage = false
	crd.Status.StoredVersions = []string{"v1beta1"}
	return crd
}

type customObject struct{ u *unstructured.Unstructured }

// widgets writes the CRD and its custom resources: per team namespace, two written at
// v1beta1 before the storage version moved and one written at v1 since.
func (w *writer) widgets(scale int) error {
	crd := WidgetCRD()
	if err := w.crd(crd); err != nil {
		return err
	}
	oldCodec, err := customresource.NewCodec(oldWidgetCRD(), customresource.Options{})
	if err != nil {
		return fmt.Errorf("CRD widgets.example.com at v1beta1: %w", err)
	}
	newCodec, err := customresource.NewCodec(crd, customresource.Options{})
	if err != nil {
		return fmt.Errorf("CRD widgets.example.com: %w", err)
	}
	colors := []string{"red", "green", "blue"}
	for t := 0; t < teamsPerScale*scale; t++ {
		ns := fmt.Sprintf("team-%02d", t)
		for i := 0; i < 3; i++ {
			name := fmt.Sprintf("widget-%d", i)
			version, codec := "v1beta1", oldCodec
			if i == 2 {
				version, codec = "v1", newCodec
			}
			m := meta(ns, name, time.Duration(t*3+i)*time.Minute)
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "example.com/" + version,
				"kind":       "Widget",
				"metadata": map[string]any{
					"name":              name,
					"namespace":         ns,
					"uid":               string(m.UID),
					"creationTimestamp": m.CreationTimestamp.UTC().Format(time.RFC3339),
					"generation":        int64(1),
				},
				"spec": map[string]any{"size": int64(1 + (t+i)%5), "color": colors[(t+i)%len(colors)]},
			}}
			if err := w.customResource(codec, GRWidgets, customObject{u}); err != nil {
				return err
			}
		}
	}
	return nil
}
