package customresource

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

const (
	testGroup = "stable.example.com"
	testKind  = "Widget"
)

// widgetSchema: spec.{size integer (default 3 when withDefault), color string,
// renamed (v1beta1: oldName, v1: newName)}, status.{ready bool}.
func widgetSchema(version string, withDefault bool) *apiextensionsv1.CustomResourceValidation {
	nameField := "oldName"
	if version == "v1" {
		nameField = "newName"
	}
	size := apiextensionsv1.JSONSchemaProps{Type: "integer"}
	if withDefault {
		size.Default = &apiextensionsv1.JSON{Raw: []byte(`3`)}
	}
	return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
		Type: "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {
				Type: "object",
				Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"size":    size,
					"color":   {Type: "string"},
					"big":     {Type: "integer"},
					"ratio":   {Type: "number"},
					nameField: {Type: "string"},
					"free":    {Type: "object", XPreserveUnknownFields: ptr.To(true)},
				},
			},
			"status": {
				Type:       "object",
				Properties: map[string]apiextensionsv1.JSONSchemaProps{"ready": {Type: "boolean"}},
			},
		},
	}}
}

// widgetCRD: versions v1beta1 and v1, storage in storageVersion, None conversion.
func widgetCRD(storageVersion string, withDefault bool) *apiextensionsv1.CustomResourceDefinition {
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets." + testGroup},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: testGroup,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: "widgets", Singular: "widget", Kind: testKind, ListKind: testKind + "List",
			},
			Scope:      apiextensionsv1.NamespaceScoped,
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.NoneConverter},
		},
	}
	for _, v := range []string{"v1beta1", "v1"} {
		crd.Spec.Versions = append(crd.Spec.Versions, apiextensionsv1.CustomResourceDefinitionVersion{
			Name: v, Served: true, Storage: v == storageVersion, Schema: widgetSchema(v, withDefault),
		})
	}
	crd.Status.AcceptedNames = crd.Spec.Names
	crd.Status.StoredVersions = []string{"v1beta1", "v1"}
	return crd
}

// apiserverJSON serialises m exactly as the apiserver stores custom resources.
func apiserverJSON(t testing.TB, m map[string]interface{}) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := unstructured.UnstructuredJSONScheme.Encode(&unstructured.Unstructured{Object: m}, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func storedWidget(version string, spec map[string]interface{}) map[string]interface{} {
	return map[string]interface{}{
		"apiVersion": testGroup + "/" + version,
		"kind":       testKind,
		"metadata": map[string]interface{}{
			"name":              "w1",
			"namespace":         "default",
			"uid":               "6f1c1d3e-8f59-4d53-9a3c-3f0b4f6e2a11",
			"generation":        int64(1),
			"creationTimestamp": "2025-01-02T03:04:05Z",
			"labels":            map[string]interface{}{"app": "w"},
			"annotations":       map[string]interface{}{"note": "keep <me> & me"},
		},
		"spec": spec,
	}
}

// ---- conversion webhook -------------------------------------------------------------

// convWebhook is a real conversion webhook: it renames spec.oldName <-> spec.newName and
// tampers with metadata the apiserver restores. mode injects faults.
type convWebhook struct {
	mu           sync.Mutex
	mode         string // "", "changeName", "changeUID", "twoObjects", "wrongResponseUID", "fail"
	calls        int
	reviewGV     []string // apiVersion of each ConversionReview received
	requestPaths []string
}

func (w *convWebhook) setMode(m string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mode = m
}

func (w *convWebhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w.mu.Lock()
	mode := w.mode
	w.calls++
	w.requestPaths = append(w.requestPaths, r.URL.Path)
	w.mu.Unlock()

	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	var review map[string]interface{}
	if err := json.Unmarshal(body, &review); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	w.mu.Lock()
	w.reviewGV = append(w.reviewGV, review["apiVersion"].(string))
	w.mu.Unlock()
	req := review["request"].(map[string]interface{})
	desired := req["desiredAPIVersion"].(string)
	var out []interface{}
	for _, o := range req["objects"].([]interface{}) {
		obj := o.(map[string]interface{})
		spec, _ := obj["spec"].(map[string]interface{})
		if spec != nil {
			if desired == testGroup+"/v1" {
				if v, ok := spec["oldName"]; ok {
					spec["newName"] = v
					delete(spec, "oldName")
				}
			} else if v, ok := spec["newName"]; ok {
				spec["oldName"] = v
				delete(spec, "newName")
			}
		}
		obj["apiVersion"] = desired
		md := obj["metadata"].(map[string]interface{})
		// Changes the apiserver must undo (all metadata but labels and annotations)...
		md["generation"] = int64(42)
		md["finalizers"] = []interface{}{"webhook.example.com/added"}
		// ...and changes it must keep.
		labels, _ := md["labels"].(map[string]interface{})
		if labels == nil {
			labels = map[string]interface{}{}
		}
		labels["converted"] = "true"
		md["labels"] = labels
		switch mode {
		case "changeName":
			md["name"] = "other"
		case "changeUID":
			md["uid"] = "00000000-0000-0000-0000-000000000000"
		}
		out = append(out, obj)
	}
	if mode == "twoObjects" {
		out = append(out, out[0])
	}
	uid := req["uid"]
	if mode == "wrongResponseUID" {
		uid = "not-the-request-uid"
	}
	result := map[string]interface{}{"status": "Success"}
	if mode == "fail" {
		result = map[string]interface{}{"status": "Failure", "message": "webhook refuses"}
	}
	resp := map[string]interface{}{
		"apiVersion": review["apiVersion"],
		"kind":       "ConversionReview",
		"response":   map[string]interface{}{"uid": uid, "convertedObjects": out, "result": result},
	}
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(resp)
}

// newServiceTLSServer starts an HTTPS server whose certificate, signed by a fresh CA,
// is valid for dnsName (like a webhook Service's <svc>.<ns>.svc) only. It returns the
// server and the CA bundle (PEM).
func newServiceTLSServer(t *testing.T, h http.Handler, dnsName string) (*httptest.Server, []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test webhook CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: dnsName},
		DNSNames:     []string{dnsName},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// tlsServerCABundle returns the PEM of an httptest TLS server's certificate (valid for
// 127.0.0.1), to be used as caBundle.
func tlsServerCABundle(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

func hostPort(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	a, ok := srv.Listener.Addr().(*net.TCPAddr)
	if !ok {
		t.Fatalf("listener address %v", srv.Listener.Addr())
	}
	return a.String()
}
