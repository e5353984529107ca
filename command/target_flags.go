package command

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/release"
	"kube-etcd-migrate/target"
)

func targetFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "target-version", Usage: "the Kubernetes release (MAJOR.MINOR) the cluster's kube-apiserver runs or is being upgraded to: store as that release's own kube-apiserver does (" + release.Range() + "); else from --apiserver-manifest's image, else kubeadm-config in etcd; migrate refuses when none says it"},
		&cli.StringFlag{Name: "storage-media-type", Value: decode.MediaTypeProtobuf, Usage: "kube-apiserver --storage-media-type for built-in resources"},
		&cli.IntFlag{Name: "concurrency", Value: 0, Usage: "decode/encode workers (0 = twice the number of CPUs)"},
		&cli.BoolFlag{Name: "encryption-only", Usage: "judge and rewrite only the encryption: an object is stale only when its value is not under the first provider's key of the encryption configuration, and it is re-encrypted with its stored bytes (storage version, media type, content) unchanged"},
		&cli.BoolFlag{Name: "full-field-manager", Usage: "run kube-apiserver's field manager on every object with managedFields; by default it is skipped for an object whose kind and managedFields (their times as an order) it was already seen to leave unchanged, which is proven to give the same bytes (docs/design.md)"},
	}
}

// targetUse is what a command does with the target kube-apiserver.
type targetUse int

const (
	// targetNone: the command decodes only (inventory, inspect, quarantine).
	targetNone targetUse = iota
	// targetJudge: the command judges objects against the target (verify):
	// the release may be read from kubeadm-config, and is assumed when
	// nothing names it.
	targetJudge
	// targetWrite: the command writes for the target, or plans to (migrate,
	// plan): a contradicted release is refused, and so is an unknown one
	// unless --dry-run.
	targetWrite
)

// targetOptions are targetFlags as given, and what the command does with
// the target (--target-version is apiServerOptions').
type targetOptions struct {
	use                              targetUse
	storageMediaType                 string
	concurrency                      int
	encryptionOnly, fullFieldManager bool
	// dryRun: a writing command's dry run, which may assume the release.
	dryRun bool
}

func newTargetOptions(c *cli.Context, use targetUse) targetOptions {
	return targetOptions{
		use:              use,
		storageMediaType: c.String("storage-media-type"),
		concurrency:      c.Int("concurrency"),
		encryptionOnly:   c.Bool("encryption-only"),
		fullFieldManager: c.Bool("full-field-manager"),
		dryRun:           c.Bool("dry-run"),
	}
}

// targetInput is what the command line says of the target, for
// target.Resolve.
func targetInput(o targetOptions, api *apiserverconfig.Config) target.Input {
	in := target.Input{APIServer: api, EncryptionConfig: api.EncryptionConfig, Prefix: api.EtcdPrefix}
	if o.use == targetNone {
		return in
	}
	in.StorageMediaType = api.StorageMediaType
	in.ReadKubeadm = true
	in.FullFieldManager = o.fullFieldManager
	in.EncryptionOnly = o.encryptionOnly
	if o.use == targetWrite {
		in.RefuseContradiction = true
		in.RequireRelease = !o.dryRun
	}
	return in
}

// targetError gives an error of setting up the run its exit code and names
// the flags in it: a usage error (exit 2) for a value the target
// kube-apiserver or the keyspace cannot take; a prefix or revision etcd has
// nothing at is a failure (exit 1).
func targetError(err error) error {
	var (
		unknown  *target.UnknownReleaseError
		contra   *target.ContradictionError
		kubeadm  *target.KubeadmReleaseError
		config   *target.ConfigError
		unmapped *apiserverconfig.UnmappedKMSEndpointError
		rel      *release.Error
		res      *decode.ResourceError
		media    *decode.MediaTypeError
		ns       *pipeline.NamespaceWithoutResourceError
		prefix   *pipeline.PrefixError
		revision *pipeline.RevisionError
	)
	var encConfig *encryption.ConfigError
	if errors.As(err, &encConfig) {
		// kube-apiserver's flag, the tool's too: its value is the file.
		flag := "--encryption-provider-config"
		if encConfig.Path != "" {
			flag += " " + encConfig.Path
		}
		err = &flagNamed{msg: flag + ": " + encConfig.Err.Error(), err: err}
	}
	switch {
	case errors.As(err, &unknown):
		return usageErr("which Kubernetes release does the cluster's kube-apiserver run? nothing said it (no --target-version, no --apiserver-manifest image, no kubeadm-config in etcd): give --target-version (one of %s) or --apiserver-manifest; nothing was written", strings.Join(unknown.Versions, ", "))
	case errors.As(err, &contra):
		return usageErr("%s; give the release the cluster's kube-apiserver will run, or the manifest it will run with; nothing was written", cliMessage(contra.Contradiction))
	case errors.As(err, &kubeadm):
		return usageErr("%v; give --target-version", kubeadm.Err)
	case errors.As(err, &prefix):
		return fmt.Errorf("--prefix %s: etcd has no keys under it, but has others (first: %q); set --prefix to kube-apiserver's --etcd-prefix", prefix.Prefix, prefix.First)
	case errors.As(err, &revision):
		return fmt.Errorf("--revision %d%s", revision.Revision, revision.Detail())
	case errors.As(err, &ns):
		return usageErr("--namespace needs --resource: the keyspace is laid out by resource first")
	case errors.As(err, &config), errors.As(err, &unmapped), errors.As(err, &rel), errors.As(err, &res), errors.As(err, &media):
		// A path of the manifest the tool cannot reach: the configuration
		// given is wrong, as for the manifest's own paths (apiServerConfig).
		return usageErr("%v", err)
	}
	return err
}

// warnAssumedRelease says, for a dry run of a writing command, which release
// it assumed when nothing named the cluster's: the storage versions, served
// versions and field managers differ by release, and a real run refuses.
func warnAssumedRelease(w io.Writer, env *pipeline.Env) {
	if !env.Target.Named() {
		fmt.Fprintf(w, "warning: dry run for kube-apiserver %s, assumed: nothing said which release the cluster runs (--target-version, --apiserver-manifest, kubeadm-config in etcd)\n", release.Linked())
	}
}

// flagNamed is a library error given the command line's words.
type flagNamed struct {
	msg string
	err error
}

func (e *flagNamed) Error() string { return e.msg }
func (e *flagNamed) Unwrap() error { return e.err }
