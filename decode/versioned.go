package decode

import (
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/recognizer"
	serverstorage "k8s.io/apiserver/pkg/server/storage"
)

// keeper lets a decode keep the object kube-apiserver's storage serializer
// decoded, in its stored version, before the storage codec defaults it (in
// place) and converts it to the internal version: what the lose-fields guard
// (reencode.RoundTrip) compares with the stored bytes, which it would
// otherwise decode once more. It is given to the storage factory as the
// decoder decorator kube-apiserver's storage codecs allow
// (AddSerializationChains): the decoders NewStorageCodec builds stay as they
// are, in the recognizer it would put them in, and the codec decodes through
// them exactly as before; the keeper only copies what they return, for the
// decodes that asked for it (by the value's first byte: each decode has a
// value of its own).
type keeper struct {
	mu    sync.Mutex
	slots map[*byte]*Versioned
}

// Versioned is an object as kube-apiserver's storage serializer decoded it,
// with no conversion and no defaulting (a deep copy: the codec's own goes on
// to be defaulted and converted), and the version and kind it was decoded as.
type Versioned struct {
	Object runtime.Object
	GVK    schema.GroupVersionKind
}

func newKeeper() *keeper { return &keeper{slots: map[*byte]*Versioned{}} }

// decorate is the storage factory's decoder decorator: the decoders it is
// given, in one recognizer, behind keepingDecoder.
func (k *keeper) decorate(ds []runtime.Decoder) []runtime.Decoder {
	return []runtime.Decoder{keepingDecoder{k: k, inner: recognizer.NewDecoder(ds...)}}
}

// install makes the storage codecs the factory builds for every group decode
// through the keeper (the factory's overrides for a whole group apply to
// each of its resources, and to those stored with them).
func (k *keeper) install(f *serverstorage.DefaultStorageFactory, groups []string) {
	for _, g := range groups {
		f.AddSerializationChains(nil, k.decorate, schema.GroupResource{Group: g, Resource: serverstorage.AllResources})
	}
}

// keepingDecoder is not a recognizing decoder: the storage codec's own
// recognizer, its only decoder, hands every value to it, and it to the
// recognizer of kube-apiserver's decoders, which decides as it would have.
type keepingDecoder struct {
	k     *keeper
	inner runtime.Decoder
}

func (d keepingDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	out, gvk, err := d.inner.Decode(data, defaults, into)
	if err != nil || out == nil || gvk == nil || len(data) == 0 {
		return out, gvk, err
	}
	d.k.mu.Lock()
	slot := d.k.slots[&data[0]]
	d.k.mu.Unlock()
	if slot != nil && slot.Object == nil {
		slot.Object, slot.GVK = out.DeepCopyObject(), *gvk
	}
	return out, gvk, err
}

// decode decodes plaintext with codec and, when keep, returns the versioned
// object too (nil if the codec did not decode through k).
func (k *keeper) decode(codec runtime.Decoder, plaintext []byte, keep bool) (runtime.Object, *Versioned, error) {
	if k == nil || !keep || len(plaintext) == 0 {
		out, _, err := codec.Decode(plaintext, nil, nil)
		return out, nil, err
	}
	slot, id := &Versioned{}, &plaintext[0]
	k.mu.Lock()
	k.slots[id] = slot
	k.mu.Unlock()
	out, _, err := codec.Decode(plaintext, nil, nil)
	k.mu.Lock()
	delete(k.slots, id)
	k.mu.Unlock()
	if err != nil || slot.Object == nil {
		return out, nil, err
	}
	return out, slot, nil
}
