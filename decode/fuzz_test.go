package decode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
)

// The apiserver's transformers log every failed decryption through klog; in these
// tests failures are the point, so keep the output readable (and fuzzing fast).
func init() {
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
}

var knownReasons = map[Reason]bool{
	ReasonNotObject: true, ReasonUnknownResource: true, ReasonUnknownKind: true,
	ReasonUndecryptable: true, ReasonCorruptEnvelope: true, ReasonCorruptPayload: true,
	ReasonWouldLoseFields: true, ReasonConversionFailed: true, ReasonOrphaned: true,
}

// FuzzDecode feeds arbitrary key suffixes and values through Decoder.Decode with the
// captured aescbc+identity EncryptionConfiguration. Decode must never panic; it either
// returns an object or a *decode.Error with a known reason naming the key, and an
// error never quotes a decrypted plaintext. The seed corpus is the values kube-apiserver
// 1.36.3 wrote (testdata/captured) and truncations of them; `make test` runs it.
func FuzzDecode(f *testing.F) {
	d, _ := capturedDecoder(f)
	for _, c := range readCaptured(f) {
		suffix := strings.TrimPrefix(c.Key, "/registry/")
		v := c.Value
		f.Add(suffix, v)
		for _, n := range []int{0, 1, 4, 5, len(v) / 4, len(v) / 2, len(v) - 17, len(v) - 16, len(v) - 5, len(v) - 4, len(v) - 1} {
			if n >= 0 && n <= len(v) {
				f.Add(suffix, v[:n])
			}
		}
		// Truncations just after the envelope's "<prefix><name>:".
		if info := encryption.EnvelopeInfo(v); info.KeyName != "" {
			off := bytes.Index(v, []byte(":"+info.KeyName+":")) + len(info.KeyName) + 2
			f.Add(suffix, v[:off+16])
			f.Add(suffix, v[:off+32])
		}
	}
	f.Add("configmaps/default/c", []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}}`))
	f.Add("secrets/default/s", []byte(`{"apiVersion":"v1","kind":"Secret","data":{"k":"aGk="}}`))
	f.Add("services/specs/default/s", []byte("k8s\x00\n\x0e\n\x02v1\x12\x07Service\x12\x00\x1a\x00\x22\x00"))
	f.Add("health", []byte("{}"))
	f.Add("secrets/default/s", []byte("k8s:enc:kms:v2:x:\x0a\x01a"))

	f.Fuzz(func(t *testing.T, suffix string, value []byte) {
		key := "/registry/" + suffix
		// Fuzzing has no per-input deadline: a hanging input would stall a worker
		// silently. Crash instead, so that the engine records the input.
		watchdog := time.AfterFunc(30*time.Second, func() {
			panic(fmt.Sprintf("Decode(%q, %q) hangs", key, value))
		})
		obj, err := d.Decode(context.Background(), etcdscan.KV{Key: key, Value: value, ModRevision: 2})
		watchdog.Stop()
		if obj == nil {
			t.Fatalf("Decode(%q) returned no Object", key)
		}
		if err == nil {
			if obj.Internal == nil || obj.StoredGVK.Kind == "" {
				t.Fatalf("Decode(%q) succeeded without an object (%+v)", key, obj.StoredGVK)
			}
			return
		}
		var de *Error
		if !errors.As(err, &de) {
			t.Fatalf("Decode(%q): %v (%T) is not a *decode.Error", key, err, err)
		}
		if !knownReasons[de.Reason] {
			t.Fatalf("Decode(%q): unknown reason %q", key, de.Reason)
		}
		if de.Key != key {
			t.Fatalf("Decode(%q): error names key %q", key, de.Key)
		}
		// A value that was really decrypted must not show up in the error.
		if obj.Encryption.Provider != encryption.ProviderIdentity && len(obj.Plaintext) >= 16 {
			msg := []byte(err.Error())
			for i := 0; i+16 <= len(obj.Plaintext); i += 8 {
				if bytes.Contains(msg, obj.Plaintext[i:i+16]) {
					t.Fatalf("Decode(%q): error quotes decrypted plaintext: %v", key, err)
				}
			}
		}
	})
}
