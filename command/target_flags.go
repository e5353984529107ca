package command

import (
	"context"
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/release"
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

// releaseFromCluster reads the release kubeadm recorded in etcd
// (pipeline.ClusterRelease) and, when there is one, makes it the target and
// applies its feature gates and emulation again. The encryption providers
// loaded for it are handed to Setup.
func releaseFromCluster(ctx context.Context, c *cli.Context, s *session, etcd etcdscan.Source, api *apiserverconfig.Config, cfg *pipeline.Config) error {
	enc, err := pipeline.LoadEncryption(ctx, *cfg)
	if err != nil {
		return err
	}
	s.enc = enc
	cfg.Encryption = enc
	rel, err := pipeline.ClusterRelease(ctx, etcd, cfg.Prefix, enc)
	if err != nil {
		// Not fatal: the release is then unknown, which migrate refuses and
		// verify states.
		fmt.Fprintf(c.App.ErrWriter, "warning: the release in kubeadm's ClusterConfiguration cannot be read: %v\n", err)
		return nil
	}
	if rel == "" {
		return nil
	}
	if err := api.SetRelease(rel, apiserverconfig.FromKubeadm); err != nil {
		return usageErr("%v; give --target-version", err)
	}
	if err := api.Apply(); err != nil {
		return usageErr("%v", err)
	}
	if note := api.LinkedOffNote(); note != "" {
		fmt.Fprintln(c.App.ErrWriter, note)
	}
	return nil
}

// knowTheRelease refuses to write when nothing said which Kubernetes release
// the cluster's kube-apiserver runs (or is being upgraded to): the storage
// versions, served versions and field managers differ by release, and bytes
// written for the wrong one are rewritten, or misread, by the right one. A dry
// run writes nothing and goes on, stating the release it assumed.
func knowTheRelease(c *cli.Context, env *pipeline.Env) error {
	api := env.Config.APIServer
	if api != nil && api.Contradiction != "" {
		return usageErr("%s; give the release the cluster's kube-apiserver will run, or the manifest it will run with; nothing was written", api.Contradiction)
	}
	if api != nil && api.Release != "" {
		return nil
	}
	if c.Bool("dry-run") {
		fmt.Fprintf(c.App.ErrWriter, "warning: dry run for kube-apiserver %s, assumed: nothing said which release the cluster runs (--target-version, --apiserver-manifest, kubeadm-config in etcd)\n", release.Linked())
		return nil
	}
	return usageErr("which Kubernetes release does the cluster's kube-apiserver run? nothing said it (no --target-version, no --apiserver-manifest image, no kubeadm-config in etcd): give --target-version (one of %s) or --apiserver-manifest; nothing was written", strings.Join(release.Versions(), ", "))
}
