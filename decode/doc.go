// Package decode turns a raw etcd key/value into what kube-apiserver would read:
// it maps the key to its group/resource, decrypts the value through a Decrypter
// (package encryption's transformers of an EncryptionConfiguration, authenticated
// by the full key), detects the media type (protobuf envelope, JSON, CBOR) and
// decodes the object through the apiserver's own scheme. Every failure is a typed
// Error naming the key; nothing here writes.
package decode
