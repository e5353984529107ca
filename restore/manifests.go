package restore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// serverSet are the metadata fields kube-apiserver sets itself, or that
// name another incarnation of an object: a manifest for kubectl create
// leaves them out. ownerReferences name their owners by uid, which a new
// owner does not have: controllers adopt by their selectors instead.
var serverSet = []string{"uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
	"deletionTimestamp", "deletionGracePeriodSeconds", "ownerReferences"}

// manifests writes each candidate as a manifest in opts.ToManifests: the
// object in its storage version (a custom resource in the version it was
// stored in), without the fields kube-apiserver sets and without status;
// one file per object, mode 0600, in a directory of mode 0700; a file that
// exists is never replaced.
func (r *run) manifests() error {
	dir := r.opts.ToManifests
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("manifests directory %s: %w", dir, err)
	}
	for _, c := range r.cands {
		doc, err := manifestOf(c)
		if err != nil {
			c.e.Action, c.e.Note = ActionUnreadable, err.Error()
			r.entry(*c.e)
			continue
		}
		name := manifestName(c)
		path := filepath.Join(dir, name)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("manifest %s: the file exists (it is never replaced): give an empty directory", path)
			}
			return fmt.Errorf("manifest %s: %w", path, err)
		}
		_, werr := f.Write(doc)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return fmt.Errorf("manifest %s: %w", path, werr)
		}
		c.e.Action, c.e.Note = ActionManifest, path
		r.res.Manifests++
		if c.gr == secretsResource {
			r.res.Secrets++
		}
		r.res.Entries = append(r.res.Entries, *c.e)
	}
	return nil
}

var secretsResource = schema.GroupResource{Resource: "secrets"}

// manifestName is ORDER-RESOURCE[.GROUP]_[NAMESPACE_]NAME.yaml, ORDER 00
// for Namespaces and CRDs, 10 for the rest: kubectl create -f DIR reads a
// directory's files in name order, and what the others need comes first.
func manifestName(c *candidate) string {
	order := "10-"
	if c.gr == nsResource || c.gr.String() == "customresourcedefinitions.apiextensions.k8s.io" {
		order = "00-"
	}
	parts := []string{order + c.gr.String()}
	if c.e.Namespace != "" {
		parts = append(parts, c.e.Namespace)
	}
	parts = append(parts, c.e.Name)
	return strings.ReplaceAll(strings.Join(parts, "_"), "/", "_") + ".yaml"
}

// manifestOf is the candidate's object as a manifest.
func manifestOf(c *candidate) ([]byte, error) {
	var content map[string]any
	switch obj := c.obj.(type) {
	case *unstructured.Unstructured:
		content = obj.DeepCopy().Object
	case nil:
		return nil, errors.New("no object decoded")
	default:
		if c.codec == nil {
			return nil, fmt.Errorf("%s: no codec", c.gr)
		}
		versioned, err := c.codec.Scheme.ConvertToVersion(obj.DeepCopyObject(), c.codec.StorageVersion)
		if err != nil {
			return nil, fmt.Errorf("convert to %s: %w", c.codec.StorageVersion, err)
		}
		if content, err = runtime.DefaultUnstructuredConverter.ToUnstructured(versioned); err != nil {
			return nil, err
		}
		gvk := versioned.GetObjectKind().GroupVersionKind()
		if gvk.Empty() {
			gvk = c.codec.StorageVersion.WithKind(c.codec.Kind)
		}
		content["apiVersion"], content["kind"] = gvk.GroupVersion().String(), gvk.Kind
	}
	if md, ok := content["metadata"].(map[string]any); ok {
		for _, f := range serverSet {
			delete(md, f)
		}
	}
	delete(content, "status")
	return yaml.Marshal(content)
}
