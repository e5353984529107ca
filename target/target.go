// Package target answers, once per run, the question the whole tool turns on:
// which kube-apiserver, of which release, with which settings and keys, are we
// writing as? From plain data (what the operator gave, already read from the
// command line and the manifest) Resolve loads the encryption configuration
// exactly once, reads kubeadm's ClusterConfiguration in etcd when nothing else
// names the release, applies the release's feature gates and emulation to the
// process, checks the release once — before any CRD is loaded or KMS plugin
// probed — and builds the target storage configuration and kube-apiserver's
// no-op update path. The result is one immutable Target the pipeline and every
// stage after it read; nothing below it decides the release again. Refusals are
// typed (release.Error, UnknownReleaseError, ContradictionError, ConfigError)
// so that the command layer picks exit codes and names flags from their type.
package target

import (
	"context"
	"fmt"
	"os"
	"strings"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/updatepath"
)

// Input is what the operator said of the target, as plain data.
type Input struct {
	// APIServer is the target kube-apiserver's command line as loaded from its
	// manifest or flags file and the tool's own --runtime-config,
	// --feature-gates and --target-version (apiserverconfig.Load), with the
	// release they name. When set, Resolve applies its gates to the process,
	// at the release settled. nil: Release's defaults, nothing applied to the
	// process (tests and benchmarks setting gates themselves).
	APIServer *apiserverconfig.Config
	// Release is the release (MAJOR.MINOR, release.ParseTarget) when
	// APIServer is nil; "" = the linked kube-apiserver's.
	Release string
	// EncryptionConfig is kube-apiserver's --encryption-provider-config; "" =
	// identity. Its KMS plugin endpoints are mapped to host paths through the
	// manifest's hostPath volumes when it is the manifest's.
	EncryptionConfig string
	// Encryption, when set, is used instead of loading EncryptionConfig; the
	// caller keeps it and closes it.
	Encryption *encryption.Transformers
	// StorageMediaType is kube-apiserver's --storage-media-type; "" = protobuf.
	StorageMediaType string
	// Prefix is kube-apiserver's --etcd-prefix ("" = /registry): where
	// kubeadm-config is read.
	Prefix string
	// ReadKubeadm reads the release from kubeadm's ClusterConfiguration in
	// etcd when neither APIServer nor Release names it.
	ReadKubeadm bool
	// KubeadmSource, when set, is where kubeadm-config is read instead of
	// the etcd resolved for: the main etcd, for another etcd of the cluster
	// (kube-apiserver's --etcd-servers-overrides), which holds none.
	KubeadmSource etcdscan.Source
	// RequireRelease refuses a target whose release nothing named
	// (UnknownReleaseError): a run that writes.
	RequireRelease bool
	// RefuseContradiction refuses a manifest whose image contradicts the
	// release given (ContradictionError): a run that writes, or would.
	RefuseContradiction bool
	// FullFieldManager runs kube-apiserver's field manager on every object,
	// never skipping it where it provably changes nothing (updatepath.Memo).
	FullFieldManager bool
	// EncryptionOnly narrows the decisions to the encryption
	// (reencode.Planner.EncryptionOnly).
	EncryptionOnly bool

	// settled is the release of a Target resolved before (Target.Input).
	settled *settled
}

// settled is a release settled by Resolve, and where it came from.
type settled struct {
	rel  release.Release
	from apiserverconfig.Source
}

// Target is the resolved kube-apiserver the run writes as. It does not change
// after Resolve.
type Target struct {
	api       *apiserverconfig.Config
	release   settled
	enc       *encryption.Transformers
	ownsEnc   bool
	storage   *decode.StorageConfig
	update    *updatepath.Path
	in        Input
	notes     []string
	encConfig string
}

// Resolve settles the target from in, reading kubeadm-config through src when
// asked to (ReadKubeadm). It returns typed errors: *release.Error (a release
// the tool cannot write for), *UnknownReleaseError and *ContradictionError
// (RequireRelease, RefuseContradiction), *ConfigError (the kube-apiserver configuration cannot be
// applied), *apiserverconfig.UnmappedKMSEndpointError and
// *decode.MediaTypeError; others are the encryption configuration's or etcd's.
func Resolve(ctx context.Context, src etcdscan.Source, in Input) (t *Target, err error) {
	t = &Target{in: in, encConfig: in.EncryptionConfig}
	api := in.APIServer
	if api == nil {
		v, err := release.ParseTarget(in.Release)
		if err != nil {
			return nil, err
		}
		if api, err = apiserverconfig.Load(apiserverconfig.Input{TargetVersion: v}); err != nil {
			return nil, err
		}
	}
	t.api = api
	t.release = settled{rel: api.Release(), from: api.From["release"]}
	if in.settled != nil {
		t.release = *in.settled
	}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	t.enc, t.ownsEnc = in.Encryption, false
	if t.enc == nil {
		// From a manifest, the KMS plugins' sockets are container paths too.
		t.enc, err = encryption.LoadWith(ctx, in.EncryptionConfig, encryption.Options{MapKMSEndpoint: api.KMSEndpointMapper(in.EncryptionConfig)})
		if err != nil {
			return nil, err
		}
		t.ownsEnc = true
	}
	if in.KubeadmSource != nil {
		src = in.KubeadmSource
	}
	if in.ReadKubeadm && !t.Named() && src != nil {
		if err := t.releaseFromKubeadm(ctx, src); err != nil {
			return nil, err
		}
	}
	if in.APIServer != nil {
		// kube-apiserver's feature gates and emulated version are
		// process-wide: its strategies and defaulting read them.
		off, err := api.Apply(t.release.rel)
		if err != nil {
			return nil, &ConfigError{Err: err}
		}
		if note := apiserverconfig.LinkedOffNote(t.release.rel, off); note != "" {
			t.notes = append(t.notes, note)
		}
	}
	if in.RefuseContradiction && api.Contradiction != nil {
		return nil, &ContradictionError{Contradiction: api.Contradiction}
	}
	if in.RequireRelease && !t.Named() {
		return nil, &UnknownReleaseError{Linked: release.Linked(), Versions: release.Versions()}
	}
	ev := t.release.rel.Effective()
	rc, err := api.ResourceConfig(ev)
	if err != nil {
		return nil, err
	}
	t.storage, err = decode.NewStorageConfigFor(decode.StorageOptions{Release: t.release.rel, MediaType: in.StorageMediaType, ResourceConfig: rc})
	if err != nil {
		return nil, err
	}
	emulation, runtimeConfig := api.EmulationForwardCompatible()
	t.update = updatepath.New(updatepath.Config{
		ResourceConfig:                          rc,
		Effective:                               ev,
		EmulationForwardCompatible:              emulation,
		RuntimeConfigEmulationForwardCompatible: runtimeConfig,
		FullFieldManager:                        in.FullFieldManager,
		CheckShortcut:                           os.Getenv(updatepath.CheckShortcutEnv) != "",
	})
	return t, nil
}

// releaseFromKubeadm makes the release kubeadm recorded in etcd the target's,
// run with the --emulated-version of the command line. One that cannot be
// read is a note, not a refusal: the release is then unknown, which
// RequireRelease refuses and a read-only run states.
func (t *Target) releaseFromKubeadm(ctx context.Context, src etcdscan.Source) error {
	found, err := ClusterRelease(ctx, src, t.in.Prefix, t.enc)
	if err != nil {
		t.notes = append(t.notes, fmt.Sprintf("warning: the release in kubeadm's ClusterConfiguration cannot be read: %v", err))
		return nil
	}
	if found == "" {
		return nil
	}
	v, err := release.Parse(found)
	if err != nil {
		return &KubeadmReleaseError{Err: fmt.Errorf("release %q (%s): not a version", found, apiserverconfig.FromKubeadm)}
	}
	rel, err := release.New(v, t.release.rel.Emulated())
	if err != nil {
		return &KubeadmReleaseError{Err: fmt.Errorf("%w (release %s from the %s)", err, v, apiserverconfig.FromKubeadm)}
	}
	t.release = settled{rel: rel, from: apiserverconfig.FromKubeadm}
	return nil
}

// APIServer is the target kube-apiserver's configuration. Read it; do not
// change it.
func (t *Target) APIServer() *apiserverconfig.Config { return t.api }

// Release is the release written for, with its --emulated-version and
// effective version: the one named, else the linked kube-apiserver's
// (assumed; Named says which).
func (t *Target) Release() release.Release { return t.release.rel }

// Named reports whether something named the release (--target-version, the
// manifest's image, kubeadm-config) rather than the linked one being assumed.
func (t *Target) Named() bool { return t.release.from != "" }

// ReleaseFrom says what named the release, "" when nothing did.
func (t *Target) ReleaseFrom() apiserverconfig.Source { return t.release.from }

// Storage is the target's storage configuration: storage versions, media
// type and codecs of the release, emulation and --runtime-config.
func (t *Target) Storage() *decode.StorageConfig { return t.storage }

// Update is kube-apiserver's no-op update path at the target.
func (t *Target) Update() *updatepath.Path { return t.update }

// Encryption is the encryption configuration: every provider reads, the first
// writes.
func (t *Target) Encryption() *encryption.Transformers { return t.enc }

// EncryptionConfig is the encryption configuration file ("" = identity).
func (t *Target) EncryptionConfig() string { return t.encConfig }

// EncryptionOnly reports whether only the encryption is judged.
func (t *Target) EncryptionOnly() bool { return t.in.EncryptionOnly }

// FullFieldManager reports whether the field manager runs on every object.
func (t *Target) FullFieldManager() bool { return t.in.FullFieldManager }

// Input is what t was resolved from, for a second run on the same terms (a
// written output snapshot verified afresh): the encryption configuration is
// loaded again, the release is the one settled.
func (t *Target) Input() Input {
	in := t.in
	in.APIServer, in.Encryption, in.ReadKubeadm = t.api, nil, false
	settled := t.release
	in.settled = &settled
	return in
}

// Notes are lines for the operator found while resolving (a kubeadm-config
// that cannot be read, feature gates left off in the linked code).
func (t *Target) Notes() []string { return t.notes }

// Close releases the encryption providers Resolve loaded (KMS connections).
func (t *Target) Close() {
	if t != nil && t.ownsEnc && t.enc != nil {
		t.enc.Close()
		t.enc = nil
	}
}

// UnknownReleaseError: nothing said which release the cluster's
// kube-apiserver runs, and the run writes.
type UnknownReleaseError struct {
	Linked   string
	Versions []string
}

func (e *UnknownReleaseError) Error() string {
	return fmt.Sprintf("which Kubernetes release does the cluster's kube-apiserver run? nothing said it (no release given, no kube-apiserver manifest image, no kubeadm-config in etcd); supported: %s", strings.Join(e.Versions, ", "))
}

// ContradictionError: the manifest's image contradicts the release given,
// and the run writes.
type ContradictionError struct{ Contradiction error }

func (e *ContradictionError) Error() string { return e.Contradiction.Error() }

func (e *ContradictionError) Unwrap() error { return e.Contradiction }

// ConfigError: the kube-apiserver configuration (feature gates, emulated
// version) cannot be applied.
type ConfigError struct{ Err error }

func (e *ConfigError) Error() string { return e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

// KubeadmReleaseError: kubeadm's ClusterConfiguration names a release the
// tool cannot write for (or no version at all).
type KubeadmReleaseError struct{ Err error }

func (e *KubeadmReleaseError) Error() string { return e.Err.Error() }
func (e *KubeadmReleaseError) Unwrap() error { return e.Err }
