// Package encryption owns encryption at rest in both directions: it builds
// kube-apiserver's own transformers from an EncryptionConfiguration file
// (k8s.io/apiserver's encryptionconfig, with the KMSv1 feature gate and the
// private copies with mapped KMS endpoints that loading needs), decrypts and
// encrypts values with the full etcd key as authenticated data, probes the KMS
// plugins before anything is written, and reads a value's envelope prefix
// (provider and key name) without decrypting it. It never returns or logs key
// material or plaintext. Package decode uses it to read
// values; it never imports decode.
package encryption
