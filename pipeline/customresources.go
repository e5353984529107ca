package pipeline

import (
	"os"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/updatepath"
)

// crCodec adapts customresource.Codec to the decode and reencode interfaces.
type crCodec struct{ *customresource.Codec }

func (c crCodec) DecodeStored(plaintext []byte) (*unstructured.Unstructured, schema.GroupVersionKind, string, error) {
	u, info, err := c.Decode(plaintext)
	mt := decode.MediaTypeJSON
	if info.MediaType == "cbor" {
		mt = decode.MediaTypeCBOR
	}
	return u, info.GVK, mt, err
}

// defaultCustomResources builds codecs whose no-op update runs the field
// manager of the target kube-apiserver's apiextensions server.
// Conversion webhooks' Services are reached at the address given in webhooks,
// or else through endpoints (read from etcd by loadCRDs before any codec is
// built).
func defaultCustomResources(webhooks map[string]string, hint func(string) string, endpoints *webhookEndpoints, update *updatepath.Path, fullFieldManager bool) CustomResourceFactory {
	return func(crd *apiextensionsv1.CustomResourceDefinition) (CustomResourceCodec, error) {
		c, err := customresource.NewCodec(crd, customresource.Options{
			WebhookURLs:       webhooks,
			ServiceEndpoints:  endpoints,
			WebhookHint:       hint,
			StaticOpenAPISpec: update.CustomResourceStaticSpec,
			Manager:           updatepath.Manager,
			FullFieldManager:  fullFieldManager,
			Memo:              update.Memo(),
			CheckShortcut:     os.Getenv(updatepath.CheckShortcutEnv) != "",
		})
		if err != nil {
			return nil, err
		}
		return crCodec{c}, nil
	}
}
