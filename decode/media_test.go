package decode

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FuzzEnvelopeTypeMeta: StoredGVK (an allocation-free read of the protobuf
// envelope's typeMeta, falling back to runtime.Unknown.Unmarshal) agrees with
// runtime.Unknown.Unmarshal, what kube-apiserver's protobuf serializer uses, on
// every input the latter accepts.
func FuzzEnvelopeTypeMeta(f *testing.F) {
	files, _ := filepath.Glob("../testdata/captured/*.bin")
	for _, p := range files {
		v, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if i := bytes.Index(v, protobufMagic); i >= 0 {
			body := v[i+len(protobufMagic):]
			f.Add(body)
			f.Add(body[:len(body)/2])
		}
	}
	f.Add([]byte("\n\x0e\n\x02v1\x12\x07Service\x12\x00\x1a\x00\x22\x00"))
	f.Add([]byte("\n\x04\x12\x02v1\n\x05\n\x03apps"))
	f.Add([]byte("\x12\x03abc"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var u runtime.Unknown
		uerr := u.Unmarshal(body)
		gvk, _, err := StoredGVK("k", append(append([]byte(nil), protobufMagic...), body...))
		if uerr == nil && u.Kind != "" {
			if err != nil {
				t.Fatalf("runtime.Unknown accepts %q, StoredGVK says %v", body, err)
			}
			if want := schema.FromAPIVersionAndKind(u.APIVersion, u.Kind); gvk != want {
				t.Fatalf("StoredGVK %v, runtime.Unknown %v", gvk, want)
			}
		}
	})
}

func TestStoredGVKOfCapturedProtobuf(t *testing.T) {
	v, err := os.ReadFile("../testdata/captured/deployment-protobuf.bin")
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.Index(v, protobufMagic)
	if i < 0 {
		t.Fatal("captured deployment is not protobuf")
	}
	gvk, mt, err := StoredGVK("/registry/deployments/default/d", v[i:])
	if err != nil || mt != MediaTypeProtobuf || gvk.GroupVersion().String() != "apps/v1" || gvk.Kind != "Deployment" {
		t.Fatalf("StoredGVK = %v, %q, %v; want apps/v1 Deployment, protobuf", gvk, mt, err)
	}
	if _, _, err := StoredGVK("/registry/deployments/default/d", v[i:len(v)-3]); err == nil {
		t.Fatal("a truncated envelope was accepted")
	}
}
