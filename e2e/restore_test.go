package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/build/modbuild"
	"kube-etcd-migrate/internal/testrig/apiserverproc"
	"kube-etcd-migrate/internal/testrig/apiservertest"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/restore"
	"kube-etcd-migrate/target"
)

// TestRestoreDeletedNamespace: a namespace holding Secrets, a ConfigMap, a
// ServiceAccount, a Deployment with its ReplicaSet (owner chain) and a custom
// resource, all written by a real kube-apiserver under key1; a backup (etcd's
// own snapshot code); then the namespace deleted and collected, the key
// rotated to key2 and key1 retired. kube-apiserver stopped, `restore
// --namespace --backup-encryption-provider-config KEY1` puts every object
// back; kube-apiserver started with key2 alone serves each with the content
// it had (uid and ownerReferences included) and a no-op update of each keeps
// its resourceVersion; `rollback --run` then deletes every key it created.
func TestRestoreDeletedNamespace(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	const ns = "shop"
	key1 := c.writeEncryptionConfig("key1.yaml", encResources, aescbcProvider("key1", 1), identityProvider)
	key2key1 := c.writeEncryptionConfig("key2-key1.yaml", encResources, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	key2 := c.writeEncryptionConfig("key2.yaml", encResources, aescbcProvider("key2", 2), identityProvider)

	cfg := c.start(apiservertest.Options{EncryptionConfigPath: key1})
	cs := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)
	ext := apiextensionsclient.NewForConfigOrDie(cfg)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": "shop"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"db", "api"} {
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"owner": "shop"}}, Data: secretData(1)}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"color": "blue"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}}}}
	dep, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	if _, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-5d4f", Labels: labels, OwnerReferences: owner},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.restore.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "restore.example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Kind: "Widget", ListKind: "WidgetList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: objectSchema(map[string]apiextensionsv1.JSONSchemaProps{"size": {Type: "integer"}})}},
		},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCRD(t, ext, crd.Name, "established", established)
	widgets := schema.GroupVersionResource{Group: "restore.example.com", Version: "v1", Resource: "widgets"}
	createCR(t, dyn, widgets, "Widget", ns, "w1", map[string]any{"size": int64(3)})

	objects := []objKey{
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Name: ns},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: ns, Name: "db"},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: ns, Name: "api"},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: ns, Name: "settings"},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}, Namespace: ns, Name: "shop"},
		{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Namespace: ns, Name: "web"},
		{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, Namespace: ns, Name: "web-5d4f"},
		{GVR: widgets, Namespace: ns, Name: "w1"},
	}
	before := map[objKey]map[string]any{}
	var beforeMF = map[objKey][]metav1.ManagedFieldsEntry{}
	for _, k := range objects {
		u, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		before[k], beforeMF[k] = content(u), u.GetManagedFields()
	}

	// The backup, by etcd's own snapshot code.
	backup := filepath.Join(t.TempDir(), "backup.db")
	if err := etcdscan.Snapshot(ctx, c.cli, backup); err != nil {
		t.Fatal(err)
	}

	// The namespace deleted and collected (no kube-controller-manager runs
	// here: its objects are deleted as its namespace controller does, then
	// the namespace finalized).
	for i := len(objects) - 1; i > 0; i-- {
		k := objects[i]
		if err := dyn.Resource(k.GVR).Namespace(k.Namespace).Delete(ctx, k.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete %s: %v", k, err)
		}
	}
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	terminating, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	terminating.Spec.Finalizers = nil
	if _, err := cs.CoreV1().Namespaces().Finalize(ctx, terminating, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("namespace %s never gone: %v", ns, err)
	}

	// The key rotated: key2 first, everything rewritten, key1 retired.
	c.stop()
	c.migrate(pipeline.Config{Target: target.Input{EncryptionConfig: key2key1}})
	c.expectCurrent(pipeline.Config{Target: target.Input{EncryptionConfig: key2}})

	// kube-apiserver stopped: the restore, with the backup's keys.
	args := []string{"restore", "--endpoints", c.etcd.URL, "--encryption-provider-config", key2, "--target-version", "1.37", "--liveness-window", "2s",
		"--snapshot-file", backup, "--namespace", ns}
	if _, stderr, code := runTool(t, append(args, "--dry-run")...); code != 1 || !strings.Contains(stderr, "aescbc:key1") || !strings.Contains(stderr, "nothing was written") {
		t.Fatalf("restore without the backup's keys: exit %d, want 1 naming aescbc:key1\n%s", code, stderr)
	}
	args = append(args, "--backup-encryption-provider-config", key1)
	out, stderr, code := runTool(t, append(args, "-o", "json")...)
	if code != 0 {
		t.Fatalf("restore: exit %d\n%s\n%s", code, out, stderr)
	}
	var res restore.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("restore -o json: %v\n%s", err, out)
	}
	var written []string
	for _, e := range res.Entries {
		if e.Result == restore.ResultWritten {
			written = append(written, e.Key)
		}
		if strings.Contains(out, "not-a-real-password") {
			t.Fatalf("a decrypted value on stdout")
		}
	}
	if len(written) != len(objects) || res.Create != int64(len(objects)) || res.Failed != 0 || res.Conflicts != 0 {
		t.Fatalf("restore wrote %d keys (%v), want %d created: %+v", len(written), written, len(objects), res)
	}
	if !cmp.Equal(res.Needs, []string{"aescbc:key1", "identity"}) {
		t.Errorf("needs %v, want aescbc:key1 and identity", res.Needs)
	}
	for _, key := range written {
		if strings.Contains(key, "/secrets/") || strings.Contains(key, "/configmaps/") {
			v, _, _ := etcdValue(t, c.cli, key)
			if !strings.HasPrefix(string(v), "k8s:enc:aescbc:v1:key2:") {
				t.Errorf("%s: not under key2", key)
			}
		}
	}

	// kube-apiserver with today's configuration alone.
	cfg = c.start(apiservertest.Options{EncryptionConfigPath: key2})
	dyn = dynamic.NewForConfigOrDie(cfg)
	for _, k := range objects {
		ri := dyn.Resource(k.GVR).Namespace(k.Namespace)
		got, err := ri.Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: not served after the restore: %v", k, err)
			continue
		}
		if d := cmp.Diff(before[k], content(got)); d != "" {
			t.Errorf("%s: content differs from the backup's (-before +after):\n%s", k, d)
		}
		if d := cmp.Diff(beforeMF[k], got.GetManagedFields()); d != "" {
			t.Errorf("%s: managedFields differ (-before +after):\n%s", k, d)
		}
		keepsResourceVersion(ctx, t, ri, got, k)
	}
	c.stop()

	// Rolled back: every key the run created is gone.
	if _, stderr, code := runTool(t, "rollback", "--endpoints", c.etcd.URL, "--encryption-provider-config", key2, "--run", "0001-restore", "--liveness-window", "2s"); code != 0 {
		t.Fatalf("rollback --run 0001-restore: exit %d\n%s", code, stderr)
	}
	for _, key := range written {
		resp, err := c.cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 0 {
			t.Errorf("%s: still there after the rollback (%v)", key, err)
		}
	}

	// The online path: the same selection as manifests, created through a
	// running kube-apiserver by kubectl create -f DIR; no decrypted value on
	// stdout or stderr.
	cfg = c.start(apiservertest.Options{EncryptionConfigPath: key2})
	dir := filepath.Join(t.TempDir(), "manifests")
	out, stderr, code = runTool(t, "restore", "--endpoints", c.etcd.URL, "--encryption-provider-config", key2, "--target-version", "1.37",
		"--snapshot-file", backup, "--namespace", ns, "--backup-encryption-provider-config", key1, "--to-manifests", dir)
	if code != 0 || !strings.Contains(stderr, "warning: "+dir+" holds 2 Secret(s)") {
		t.Fatalf("restore --to-manifests: exit %d\n%s\n%s", code, out, stderr)
	}
	if pw := secretData(1)["password"]; strings.Contains(out+stderr, string(pw)) || strings.Contains(out+stderr, base64.StdEncoding.EncodeToString(pw)) {
		t.Errorf("a decrypted value on stdout or stderr")
	}
	// kubectl create -f DIR, as the runbook says: every file of DIR in
	// name order (the Namespace's first).
	kc := kubeconfigOf(t, cfg)
	kout, kerr := exec.Command(kubectlBinary(t), "--kubeconfig", kc, "create", "-f", dir).CombinedOutput()
	if kerr != nil {
		t.Fatalf("kubectl create -f %s: %v\n%s", dir, kerr, kout)
	}
	dyn = dynamic.NewForConfigOrDie(cfg)
	for _, k := range objects {
		got, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s after kubectl create -f: %v\n%s", k, err, kout)
			continue
		}
		want := before[k]
		if spec := want["spec"]; spec != nil && k.GVR.Resource != "namespaces" && !cmp.Equal(spec, got.Object["spec"]) {
			t.Errorf("%s: spec differs from the backup's:\n%s", k, cmp.Diff(spec, got.Object["spec"]))
		}
		if d, ok := want["data"]; ok && !cmp.Equal(d, got.Object["data"]) {
			t.Errorf("%s: data differs from the backup's", k)
		}
	}
	c.stop()
}

// TestRestoreFromPreviousRelease: a backup written by the real kube-apiserver
// of the previous release (its storage versions, its defaults) is restored
// into a cluster of the linked release: the linked kube-apiserver serves each
// object with the content the previous release served (uid, owners, labels,
// annotations, data, spec, status), and a no-op update keeps each one's
// resourceVersion.
func TestRestoreFromPreviousRelease(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t)
	const ns = "legacy"
	key1 := c.writeEncryptionConfig("key1.yaml", encResources, aescbcProvider("key1", 1), identityProvider)
	key2 := c.writeEncryptionConfig("key2.yaml", encResources, aescbcProvider("key2", 2), aescbcProvider("key1", 1), identityProvider)
	old := apiserverproc.Start(t, apiserverproc.Options{Binary: olderAPIServer(t, modbuild.PreviousKubernetes), EtcdURL: c.etcd.URL, EncryptionConfigPath: key1})
	cs := kubernetes.NewForConfigOrDie(old.ClientConfig)
	dyn := dynamic.NewForConfigOrDie(old.ClientConfig)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "db", Labels: map[string]string{"a": "b"}}, Data: secretData(2)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "settings", Annotations: map[string]string{"x": "y"}}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "old"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	dep, err := cs.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().ReplicaSets(ns).Create(ctx, &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web-1", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID, Controller: ptr.To(true)}}},
		Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objects := []objKey{
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Name: ns},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: ns, Name: "db"},
		{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Namespace: ns, Name: "settings"},
		{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Namespace: ns, Name: "web"},
		{GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "replicasets"}, Namespace: ns, Name: "web-1"},
	}
	before := map[objKey]*unstructured.Unstructured{}
	for _, k := range objects {
		u, err := dyn.Resource(k.GVR).Namespace(k.Namespace).Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		before[k] = u
	}
	backup := filepath.Join(t.TempDir(), "backup.db")
	if err := etcdscan.Snapshot(ctx, c.cli, backup); err != nil {
		t.Fatal(err)
	}
	old.Stop()
	// The cluster upgraded, the namespace gone.
	for _, p := range []string{"/registry/namespaces/" + ns, "/registry/secrets/" + ns + "/", "/registry/configmaps/" + ns + "/", "/registry/deployments/" + ns + "/", "/registry/replicasets/" + ns + "/"} {
		if _, err := c.cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
	}
	c.migrate(pipeline.Config{Target: target.Input{EncryptionConfig: key2}})

	out, stderr, code := runTool(t, "restore", "--endpoints", c.etcd.URL, "--encryption-provider-config", key2, "--target-version", "1.37", "--liveness-window", "2s",
		"--snapshot-file", backup, "--namespace", ns, "--backup-encryption-provider-config", key1)
	if code != 0 || !strings.Contains(out, "create 5, overwrite 0") || !strings.Contains(out, "written 5") {
		t.Fatalf("restore of the %s backup: exit %d\n%s\n%s", modbuild.PreviousKubernetes, code, out, stderr)
	}
	cfg := c.start(apiservertest.Options{EncryptionConfigPath: key2})
	dyn = dynamic.NewForConfigOrDie(cfg)
	for _, k := range objects {
		ri := dyn.Resource(k.GVR).Namespace(k.Namespace)
		got, err := ri.Get(ctx, k.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s: not served after the restore: %v", k, err)
			continue
		}
		want := before[k]
		if got.GetUID() != want.GetUID() || !cmp.Equal(got.GetOwnerReferences(), want.GetOwnerReferences()) || !cmp.Equal(got.GetLabels(), want.GetLabels()) || !cmp.Equal(got.GetAnnotations(), want.GetAnnotations()) {
			t.Errorf("%s: metadata differs from the backup's:\n%s", k, cmp.Diff(want.Object["metadata"], got.Object["metadata"]))
		}
		if !cmp.Equal(want.Object["data"], got.Object["data"]) {
			t.Errorf("%s: data differs from the backup's", k)
		}
		if d := cmp.Diff(content(want), content(got)); d != "" {
			t.Errorf("%s: content differs from what %s served (-%s +linked):\n%s", k, modbuild.PreviousKubernetes, modbuild.PreviousKubernetes, d)
		}
		keepsResourceVersion(ctx, t, ri, got, k)
	}
	c.stop()
}

// keepsResourceVersion does a no-op update of got (what kube-apiserver served
// for k: a GET, then a PUT of it unchanged) and checks that kube-apiserver
// wrote nothing: the object is stored as it stores it.
func keepsResourceVersion(ctx context.Context, t *testing.T, ri dynamic.ResourceInterface, got *unstructured.Unstructured, k objKey) {
	t.Helper()
	upd, err := ri.Update(ctx, got, metav1.UpdateOptions{FieldManager: "e2e-no-op"})
	if err != nil {
		t.Errorf("%s: no-op update: %v", k, err)
		return
	}
	if upd.GetResourceVersion() != got.GetResourceVersion() {
		t.Errorf("%s: a no-op update was written (resourceVersion %s -> %s): not stored as kube-apiserver stores it", k, got.GetResourceVersion(), upd.GetResourceVersion())
	}
}

// kubeconfigOf writes cfg, a kube-apiserver's client configuration, as a
// kubeconfig file for kubectl.
func kubeconfigOf(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthority: cfg.CAFile, CertificateAuthorityData: cfg.CAData,
		InsecureSkipTLSVerify: cfg.Insecure, TLSServerName: cfg.ServerName}
	kc.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificate: cfg.CertFile, ClientKey: cfg.KeyFile,
		ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	kc.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}
