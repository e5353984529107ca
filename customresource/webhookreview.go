package customresource

import (
	"context"
	"errors"
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// createConversionReviewObjects is conversion.createConversionReviewObjects: the first
// of conversionReviewVersions that is v1 or v1beta1 wins.
func createConversionReviewObjects(conversionReviewVersions []string, objects []runtime.RawExtension, apiVersion string, requestUID types.UID) (request, response runtime.Object, err error) {
	for _, version := range conversionReviewVersions {
		switch version {
		case apiextensionsv1beta1.SchemeGroupVersion.Version:
			return &apiextensionsv1beta1.ConversionReview{
				Request: &apiextensionsv1beta1.ConversionRequest{
					Objects:           objects,
					DesiredAPIVersion: apiVersion,
					UID:               requestUID,
				},
				Response: &apiextensionsv1beta1.ConversionResponse{},
			}, &apiextensionsv1beta1.ConversionReview{}, nil
		case apiextensionsv1.SchemeGroupVersion.Version:
			return &apiextensionsv1.ConversionReview{
				Request: &apiextensionsv1.ConversionRequest{
					Objects:           objects,
					DesiredAPIVersion: apiVersion,
					UID:               requestUID,
				},
				Response: &apiextensionsv1.ConversionResponse{},
			}, &apiextensionsv1.ConversionReview{}, nil
		}
	}
	return nil, nil, fmt.Errorf("no supported conversion review versions")
}

// getConvertedObjectsFromResponse is conversion.getConvertedObjectsFromResponse.
func getConvertedObjectsFromResponse(expectedUID types.UID, response runtime.Object) ([]runtime.RawExtension, error) {
	switch response := response.(type) {
	case *apiextensionsv1.ConversionReview:
		v1GVK := apiextensionsv1.SchemeGroupVersion.WithKind("ConversionReview")
		if response.GroupVersionKind() != v1GVK {
			return nil, fmt.Errorf("expected webhook response of %v, got %v", v1GVK.String(), response.GroupVersionKind().String())
		}
		if response.Response == nil {
			return nil, fmt.Errorf("no response provided")
		}
		if response.Response.UID != expectedUID {
			return nil, fmt.Errorf("expected response.uid=%q, got %q", expectedUID, response.Response.UID)
		}
		if response.Response.Result.Status != metav1.StatusSuccess {
			if len(response.Response.Result.Message) > 0 {
				return nil, errors.New(response.Response.Result.Message)
			}
			return nil, fmt.Errorf("response.result.status was '%s', not 'Success'", response.Response.Result.Status)
		}
		return response.Response.ConvertedObjects, nil
	case *apiextensionsv1beta1.ConversionReview:
		// v1beta1 processing did not verify GVK or UID, so skip those for compatibility
		if response.Response == nil {
			return nil, fmt.Errorf("no response provided")
		}
		if response.Response.Result.Status != metav1.StatusSuccess {
			if len(response.Response.Result.Message) > 0 {
				return nil, errors.New(response.Response.Result.Message)
			}
			return nil, fmt.Errorf("response.result.status was '%s', not 'Success'", response.Response.Result.Status)
		}
		return response.Response.ConvertedObjects, nil
	default:
		return nil, fmt.Errorf("unrecognized response type: %T", response)
	}
}

// getRawExtensionObject is conversion.getRawExtensionObject.
func getRawExtensionObject(rx runtime.RawExtension) (runtime.Object, error) {
	if rx.Object != nil {
		return rx.Object, nil
	}
	u := unstructured.Unstructured{}
	if err := u.UnmarshalJSON(rx.Raw); err != nil {
		return nil, err
	}
	return &u, nil
}

// convert is webhookConverter.Convert for a single object that is not in toGV.
func (w *webhookConverter) convert(ctx context.Context, in *unstructured.Unstructured, toGV schema.GroupVersion) (*unstructured.Unstructured, error) {
	if in.GetAPIVersion() == toGV.String() {
		// getObjectsToConvert returns nothing: the object is returned as is.
		return in, nil
	}
	out, err := w.convertOne(ctx, in, toGV)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err() // the run stops: not the webhook's failure
	}
	w.count(err)
	return out, err
}

func (w *webhookConverter) convertOne(ctx context.Context, in *unstructured.Unstructured, toGV schema.GroupVersion) (*unstructured.Unstructured, error) {
	inGVK := in.GroupVersionKind()
	desiredAPIVersion := toGV.String()
	requestUID := uuid.NewUUID()
	objects := []runtime.RawExtension{{Object: in}}
	request, response, err := createConversionReviewObjects(w.conversionReviewVersions, objects, desiredAPIVersion, requestUID)
	if err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	if err := w.restClient.Post().Body(request).Do(ctx).Into(response); err != nil {
		return nil, fmt.Errorf("conversion webhook for %v failed: %v", inGVK, err)
	}
	convertedObjects, err := getConvertedObjectsFromResponse(requestUID, response)
	if err != nil {
		return nil, fmt.Errorf("conversion webhook for %v failed: %v", inGVK, err)
	}
	if len(convertedObjects) != 1 {
		return nil, fmt.Errorf("conversion webhook for %v returned %d objects, expected %d", inGVK, len(convertedObjects), 1)
	}
	converted, err := getRawExtensionObject(convertedObjects[0])
	if err != nil {
		return nil, fmt.Errorf("conversion webhook for %v returned an invalid object: %v", inGVK, err)
	}
	if e, a := toGV, converted.GetObjectKind().GroupVersionKind().GroupVersion(); e != a {
		return nil, fmt.Errorf("conversion webhook for %v returned invalid object at index 0: invalid groupVersion (expected %v, received %v)", inGVK, e, a)
	}
	if e, a := inGVK.Kind, converted.GetObjectKind().GroupVersionKind().Kind; e != a {
		return nil, fmt.Errorf("conversion webhook for %v returned invalid object at index 0: invalid kind (expected %v, received %v)", inGVK, e, a)
	}
	unstructConverted, ok := converted.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("conversion webhook for %v failed, unexpected type %T at index 0", inGVK, converted)
	}
	if err := validateConvertedObject(in, unstructConverted); err != nil {
		return nil, fmt.Errorf("conversion webhook for %v returned invalid object: %v", inGVK, err)
	}
	if err := restoreObjectMeta(in, unstructConverted); err != nil {
		return nil, fmt.Errorf("conversion webhook for %v returned invalid metadata: %v", inGVK, err)
	}
	return unstructConverted, nil
}

// validateConvertedObject is conversion.validateConvertedObject: ObjectMeta fields must
// match, with the exception of labels and annotations.
func validateConvertedObject(in, out *unstructured.Unstructured) error {
	if e, a := in.GetKind(), out.GetKind(); e != a {
		return fmt.Errorf("must have the same kind: %v != %v", e, a)
	}
	if e, a := in.GetName(), out.GetName(); e != a {
		return fmt.Errorf("must have the same name: %v != %v", e, a)
	}
	if e, a := in.GetNamespace(), out.GetNamespace(); e != a {
		return fmt.Errorf("must have the same namespace: %v != %v", e, a)
	}
	if e, a := in.GetUID(), out.GetUID(); e != a {
		return fmt.Errorf("must have the same UID: %v != %v", e, a)
	}
	return nil
}

// restoreObjectMeta is conversion.restoreObjectMeta: deep-copies metadata from original
// into converted, keeping labels and annotations from converted (validated if changed).
func restoreObjectMeta(original, converted *unstructured.Unstructured) error {
	obj, found := converted.Object["metadata"]
	if !found {
		return fmt.Errorf("missing metadata in converted object")
	}
	responseMetaData, ok := obj.(map[string]interface{})
	if !ok {
		return fmt.Errorf("invalid metadata of type %T in converted object", obj)
	}
	if _, ok := original.Object["metadata"]; !ok {
		converted.Object["metadata"] = map[string]interface{}{}
	} else {
		converted.Object["metadata"] = runtime.DeepCopyJSONValue(original.Object["metadata"])
	}
	obj = converted.Object["metadata"]
	convertedMetaData, ok := obj.(map[string]interface{})
	if !ok {
		return fmt.Errorf("invalid metadata of type %T in input object", obj)
	}
	for _, fld := range []string{"labels", "annotations"} {
		obj, found := responseMetaData[fld]
		if !found || obj == nil {
			delete(convertedMetaData, fld)
			continue
		}
		responseField, ok := obj.(map[string]interface{})
		if !ok {
			return fmt.Errorf("invalid metadata.%s of type %T in converted object", fld, obj)
		}
		originalField, ok := convertedMetaData[fld].(map[string]interface{})
		if !ok && convertedMetaData[fld] != nil {
			return fmt.Errorf("invalid metadata.%s of type %T in original object", fld, convertedMetaData[fld])
		}
		somethingChanged := len(originalField) != len(responseField)
		for k, v := range responseField {
			if _, ok := v.(string); !ok {
				return fmt.Errorf("metadata.%s[%s] must be a string, but is %T in converted object", fld, k, v)
			}
			if originalField[k] != interface{}(v) {
				somethingChanged = true
			}
		}
		if somethingChanged {
			stringMap := make(map[string]string, len(responseField))
			for k, v := range responseField {
				stringMap[k] = v.(string)
			}
			var errs field.ErrorList
			if fld == "labels" {
				errs = metav1validation.ValidateLabels(stringMap, field.NewPath("metadata", "labels"))
			} else {
				errs = apivalidation.ValidateAnnotations(stringMap, field.NewPath("metadata", "annotation"))
			}
			if len(errs) > 0 {
				return errs.ToAggregate()
			}
		}
		convertedMetaData[fld] = responseField
	}
	return nil
}
