package encryption

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	apiserverconfig "k8s.io/apiserver/pkg/apis/apiserver"
	apiserverinstall "k8s.io/apiserver/pkg/apis/apiserver/install"
	apiserverconfigv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	utilfeature "k8s.io/apiserver/pkg/util/feature"

	"kube-etcd-migrate/internal/textfmt"
)

// apiServerID is what the KMS v2 transformer records as the writer of new DEKs.
const apiServerID = "kube-etcd-migrate"

var configCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	apiserverinstall.Install(s)
	return serializer.NewCodecFactory(s)
}()

// Load loads an EncryptionConfiguration file in kube-apiserver's format
// (path "" means no encryption: identity for every resource). KMS plugins are dialled
// here; their connections live until Close. A KMS v1 provider in the file turns on
// the deprecated KMSv1 feature gate, as the kube-apiserver that wrote those values
// must have had it.
func Load(ctx context.Context, path string) (*Transformers, error) {
	return LoadWith(ctx, path, Options{})
}

// Options tune LoadWith.
type Options struct {
	// MapKMSEndpoint, when set, gives the endpoint to dial for each KMS provider's
	// endpoint as the file writes it (kube-apiserver's socket path is not always
	// the tool's: see apiserverconfig). Returning it unchanged keeps it; an error
	// stops the load. When an endpoint changes, the configuration is loaded from
	// a private copy with the new endpoints, decoded and re-encoded through the
	// apiserver's own EncryptionConfiguration v1 types (every other field as
	// written): a 0600 file in a 0700 temporary directory, removed as soon as the
	// apiserver's loader has read it.
	MapKMSEndpoint func(endpoint string) (string, error)
}

// LoadWith is Load with options.
func LoadWith(ctx context.Context, path string, opts Options) (*Transformers, error) {
	e := &Transformers{Path: path}
	if path == "" {
		e.config = &apiserverconfig.EncryptionConfiguration{}
		e.transformers = encryptionconfig.StaticTransformers{}
		e.cancel = func() {}
		return e, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Err: err}
	}
	mapped := false
	if opts.MapKMSEndpoint != nil {
		if data, mapped, err = mapKMSEndpoints(path, data, opts.MapKMSEndpoint); err != nil {
			return nil, err
		}
	}
	obj, gvk, err := configCodecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, configError(path, fmt.Errorf("not an EncryptionConfiguration: %s", redactDecodeError(err)))
	}
	cfg, ok := obj.(*apiserverconfig.EncryptionConfiguration)
	if !ok {
		return nil, configError(path, fmt.Errorf("got %s, want EncryptionConfiguration", gvk))
	}
	if usesKMSv1(cfg) && !utilfeature.DefaultFeatureGate.Enabled(features.KMSv1) {
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{string(features.KMSv1): true}); err != nil {
			return nil, configError(path, fmt.Errorf("enabling the KMSv1 feature gate for its KMS v1 provider: %w", err))
		}
	}
	kctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var loaded *encryptionconfig.EncryptionConfiguration
	if mapped {
		loaded, err = loadPrivateCopy(kctx, path, data)
	} else {
		loaded, err = encryptionconfig.LoadEncryptionConfig(kctx, path, false, apiServerID)
	}
	if err != nil {
		cancel()
		return nil, configError(path, errors.New(redactConfigError(err)))
	}
	e.config = cfg
	e.transformers = encryptionconfig.StaticTransformers(loaded.Transformers)
	e.cancel = cancel
	return e, nil
}

// strictConfigCodecs decode as kube-apiserver's encryptionconfig loader does:
// strictly (an unknown or duplicate field is an error), so that the private
// copy never drops a field kube-apiserver would have refused.
var strictConfigCodecs = func() serializer.CodecFactory {
	s := runtime.NewScheme()
	apiserverinstall.Install(s)
	return serializer.NewCodecFactory(s, serializer.EnableStrict)
}()

// ConfigError is an encryption configuration file that cannot be loaded as
// kube-apiserver would load it.
type ConfigError struct {
	Path string // "" when Err names it (a file that cannot be read)
	Err  error
}

func (e *ConfigError) Error() string {
	if e.Path == "" {
		return "encryption configuration: " + e.Err.Error()
	}
	return "encryption configuration " + e.Path + ": " + e.Err.Error()
}

func (e *ConfigError) Unwrap() error { return e.Err }

func configError(path string, err error) error { return &ConfigError{Path: path, Err: err} }

// mapKMSEndpoints returns data with each KMS provider's endpoint replaced by
// what mapEndpoint gives, and whether any changed (data is returned as it is
// when none did). The file is decoded into the apiserver's
// EncryptionConfiguration v1 type without defaulting or conversion and encoded
// back through the same scheme: resources, providers, their order, key names
// and secrets are kept as written. Errors never quote the file's content.
func mapKMSEndpoints(path string, data []byte, mapEndpoint func(string) (string, error)) ([]byte, bool, error) {
	obj, gvk, err := strictConfigCodecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, false, configError(path, fmt.Errorf("not an EncryptionConfiguration kube-apiserver would load: %s", redactDecodeError(err)))
	}
	cfg, ok := obj.(*apiserverconfigv1.EncryptionConfiguration)
	if !ok {
		return nil, false, configError(path, fmt.Errorf("got %s, want EncryptionConfiguration", gvk))
	}
	changed := false
	for i := range cfg.Resources {
		for j := range cfg.Resources[i].Providers {
			kms := cfg.Resources[i].Providers[j].KMS
			if kms == nil {
				continue
			}
			ep, err := mapEndpoint(kms.Endpoint)
			if err != nil {
				return nil, false, configError(path, fmt.Errorf("kms provider %q: %w", kms.Name, err))
			}
			if ep != kms.Endpoint {
				kms.Endpoint = ep
				changed = true
			}
		}
	}
	if !changed {
		return data, false, nil
	}
	info, ok := runtime.SerializerInfoForMediaType(configCodecs.SupportedMediaTypes(), runtime.ContentTypeYAML)
	if !ok {
		return nil, false, configError(path, errors.New("no YAML encoder"))
	}
	out, err := runtime.Encode(configCodecs.EncoderForVersion(info.Serializer, apiserverconfigv1.SchemeGroupVersion), cfg)
	if err != nil {
		return nil, false, configError(path, fmt.Errorf("encoding it with the mapped KMS endpoints: %w", err))
	}
	return out, true, nil
}

// Private copies of encryption configurations being loaded that are files
// (where memFile cannot be used), removed by RemoveTempDirs when the process
// must exit at once.
var (
	tempMu   sync.Mutex
	tempDirs = map[string]bool{}
	exiting  bool // RemoveTempDirs ran: no new copy is made
)

// RemoveTempDirs removes the private copies of encryption configurations
// still on disk (each is removed as soon as it is loaded; this is for a
// process about to exit without running its deferred calls, a second SIGINT).
func RemoveTempDirs() {
	tempMu.Lock()
	defer tempMu.Unlock()
	exiting = true
	for d := range tempDirs {
		_ = os.RemoveAll(d)
		delete(tempDirs, d)
	}
}

// privateCopyHook, set by tests, sees each private copy before it is loaded.
var privateCopyHook func(file string)

// loadPrivateCopy loads data, the configuration of the file path with mapped
// KMS endpoints, through the apiserver's loader (which only reads a file): it
// holds the secrets of every provider, so it is put in an anonymous file in
// this process's memory (memFile), never on a filesystem. Where the system has
// none, it is written to a file only its owner can read, in a directory only
// its owner can enter, and removed before returning (a SIGKILL between the two
// would leave it: RemoveTempDirs covers only exits the process sees). Errors
// name path, never the copy.
func loadPrivateCopy(ctx context.Context, path string, data []byte) (*encryptionconfig.EncryptionConfiguration, error) {
	copyPath, done, err := privateCopy(data)
	if err != nil {
		return nil, fmt.Errorf("private copy with the mapped KMS endpoints: %w", err)
	}
	defer done()
	if privateCopyHook != nil {
		privateCopyHook(copyPath)
	}
	loaded, err := encryptionconfig.LoadEncryptionConfig(ctx, copyPath, false, apiServerID)
	if err != nil {
		return nil, errors.New(strings.ReplaceAll(err.Error(), copyPath, path+" (with the mapped KMS endpoints)"))
	}
	return loaded, nil
}

// privateCopy puts data where only this process reads it, in memory if it
// can (memFile), and returns its path and what removes it.
func privateCopy(data []byte) (string, func(), error) {
	tempMu.Lock()
	if exiting {
		tempMu.Unlock()
		return "", nil, errors.New("interrupted")
	}
	tempMu.Unlock()
	if p, done, err := memFile(data); err == nil {
		return p, done, nil
	}
	tempMu.Lock()
	defer tempMu.Unlock()
	if exiting { // RemoveTempDirs ran meanwhile
		return "", nil, errors.New("interrupted")
	}
	dir, err := os.MkdirTemp("", "kube-etcd-migrate-encryption-") // 0700
	if err != nil {
		return "", nil, err
	}
	tempDirs[dir] = true
	done := func() {
		tempMu.Lock()
		defer tempMu.Unlock()
		_ = os.RemoveAll(dir)
		delete(tempDirs, dir)
	}
	copyPath := filepath.Join(dir, "encryption-config.yaml")
	if err := writePrivate(copyPath, data); err != nil {
		_ = os.RemoveAll(dir)
		delete(tempDirs, dir)
		return "", nil, err
	}
	return copyPath, done, nil
}

// writePrivate creates file (it must not exist) readable by its owner only.
func writePrivate(file string, data []byte) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// redactConfigError keeps kube-apiserver's errors loading a configuration
// short and on one line. Its validation messages name fields, never values;
// the message of its decoding the file is redactDecodeError's.
func redactConfigError(err error) string {
	msg := err.Error()
	const decoding = "error decoding encryption provider configuration file "
	if i := strings.Index(msg, decoding); i >= 0 {
		inner := "(the decoder's message is not shown: it quotes the file)"
		if j := strings.Index(msg[i:], `": `); j >= 0 {
			inner = decodeMessage(msg[i+j+3:])
		}
		msg = msg[:i] + "error decoding the file: " + inner
	}
	return oneShortLine(msg)
}

// redactDecodeError is a decoding error of the file, short, on one line,
// never quoting the file (decodeMessage).
func redactDecodeError(err error) string { return oneShortLine(decodeMessage(err.Error())) }

// decodeMessage is msg, a decoder's error, if it quotes nothing of the
// file: the decoders' messages quote what they read — the whole file when
// kind or apiVersion is missing ("Object 'Kind' is missing in '<the
// file>'"), an unknown or repeated field's name as written (broken YAML, a
// missing space after a colon, makes a key and its secret one name), a key
// that is a list or a map printed whole (each found by FuzzLoad). So it is
// shown only in the shapes of shownDecodeErrors (a field's name only when
// it reads as one), any other as "not shown".
func decodeMessage(msg string) string {
	if i := strings.Index(msg, " is missing in '"); i >= 0 {
		msg = msg[:i] + " is missing"
	}
	if m := notAnObject.FindStringSubmatch(msg); m != nil {
		article := "a"
		if strings.ContainsAny(m[1][:1], "aeiou") {
			article = "an"
		}
		msg = "couldn't get version/kind: the document is " + article + " " + m[1] + ", not an object"
	}
	msg = namedField.ReplaceAllStringFunc(msg, func(m string) string {
		sub := namedField.FindStringSubmatch(m)
		segs := strings.Split(sub[2], ".")
		for i, s := range segs {
			if !fieldSegment.MatchString(s) {
				segs[i] = fmt.Sprintf("<%d characters not shown>", len(s))
			}
		}
		return sub[1] + `"` + strings.Join(segs, ".") + `"`
	})
	for _, line := range strings.Split(msg, "\n") {
		line = strings.TrimSpace(line)
		shown := line == ""
		for _, re := range shownDecodeErrors {
			shown = shown || re.MatchString(line)
		}
		if !shown {
			return "it does not decode (the decoder's message is not shown: it quotes the file)"
		}
	}
	return msg
}

func oneShortLine(msg string) string {
	msg = textfmt.OneLine(msg)
	if len(msg) > 500 {
		msg = msg[:500] + "…"
	}
	return msg
}

var (
	// namedField is a field named in a decoding error as written: strict
	// decoding's unknown or duplicate field (sigs.k8s.io/json), YAML's key
	// set twice (go-yaml).
	namedField = regexp.MustCompile(`((?:unknown|duplicate) field |key )"((?:[^"\\]|\\.)*)"`)
	// notAnObject is the decoder's error for a document that is no object
	// (it prints the Go type it decoded into).
	notAnObject = regexp.MustCompile(`^couldn't get version/kind; json parse error: json: cannot unmarshal ([a-z]+) into Go value of type struct`)
	// fieldSegment is a segment of a field's path that reads as a field's
	// name (at most 24 letters and digits: no key material, which is longer
	// or holds base64's '=', '+' or '/'), with an index perhaps.
	fieldSegment = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,23}(\[[0-9]+\])*$`)
	// shownDecodeErrors are the shapes of a decoding error's lines that
	// quote nothing of the file but what namedField kept and single
	// punctuation marks: YAML's syntax errors, JSON's type errors (Go's
	// types and the fields' paths), strict decoding's fields, a missing kind
	// or apiVersion.
	shownDecodeErrors = []*regexp.Regexp{
		regexp.MustCompile(`^(strict decoding error: )?(error converting YAML to JSON: )?yaml: (line \d+: )?[a-z][a-z ]*('[^'\s]{1,3}'( or '[^'\s]{1,3}')?[a-z ]*)?$`),
		regexp.MustCompile(`^(strict decoding error: )?yaml: unmarshal errors:$`),
		regexp.MustCompile(`^line \d+: key "[^"]*" already set in map$`),
		regexp.MustCompile(`^yaml: unknown anchor '[A-Za-z0-9_-]{1,24}' referenced$`),
		regexp.MustCompile(`^yaml: !!binary value contains invalid base64 data$`),
		regexp.MustCompile(`^(couldn't get version/kind; json parse error: )?json: cannot unmarshal [a-z]+ into Go (struct field [A-Za-z0-9_.]+|value) of type [^'"]+$`),
		regexp.MustCompile(`^strict decoding error: ((unknown|duplicate) field "[^"]*"(, )?)+$`),
		regexp.MustCompile(`^Object '(Kind|apiVersion)' is missing$`),
		regexp.MustCompile(`^couldn't get version/kind: the document is an? [a-z]+, not an object$`),
	}
)

func usesKMSv1(cfg *apiserverconfig.EncryptionConfiguration) bool {
	for _, r := range cfg.Resources {
		for _, p := range r.Providers {
			if p.KMS != nil && p.KMS.APIVersion != "v2" {
				return true
			}
		}
	}
	return false
}
