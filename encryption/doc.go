// Package encryption owns encryption at rest in both directions: it builds
// kube-apiserver's own transformers from an EncryptionConfiguration file
// (k8s.io/apiserver's encryptionconfig, with the KMSv1 feature gate and the
// private copies with mapped KMS endpoints that loading needs), decrypts and
// encrypts values with the full etcd key as authenticated data, probes the KMS
// plugins before anything is written, and reads a value's envelope prefix
// (provider and key name) without decrypting it. It never returns or logs key
// material or plaintext. Package decode uses it to read
// values; it never imports decode.
//
// load.go loads a configuration (Load, the private copies, ConfigError),
// memfile_linux.go holds a private copy in memory only (memfd_create),
// encryption.go transforms values (Transformers: Decrypt, Encrypt, which
// provider a resource reads and writes with), kms.go probes the KMS plugins
// (Preflight, CheckKMSPlugins, KMSPluginError), envelope.go reads a value's
// prefix without decrypting it.
package encryption
