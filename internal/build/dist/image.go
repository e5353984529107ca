package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image: the static binary on an empty base, for nodes with no package
// manager (Flatcar, Talos, Bottlerocket), run with ctr, crictl or as a static
// pod (docs/runbooks.md). Its default user is not root; reading kubeadm's
// etcd client key and writing the state directory need root, which the
// runbook's commands ask for.
const (
	imageRepo = "localhost/kube-etcd-migrate" // the name it is imported under: no registry publishes it
	nonRoot   = "65532"                       // the conventional nonroot uid and gid of distroless images
)

// imageName is the reference the image is imported as (ctr, podman).
func imageName(st stamp) string { return imageRepo + ":" + st.Version }

// imageLayer is the image's one layer: the binary at /usr/bin, a /tmp for
// $TMPDIR (quarantine restores a --snapshot-file there), the state
// directory's mount point (private: 0700, owned by the default user).
func imageLayer(bin []byte, st stamp) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entries := []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/kube-etcd-migrate", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bin))},
		{Name: "var/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "var/lib/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "var/lib/kube-etcd-migrate/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: 65532, Gid: 65532},
	}
	for _, h := range entries {
		h.ModTime, h.Format = st.Time, tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bin); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// image builds the OCI image of the binary for p.
func image(bin []byte, p platform, st stamp) (v1.Image, error) {
	layerTar, err := imageLayer(bin, st)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: st.Time}, CreatedBy: "make release", Comment: "kube-etcd-migrate " + st.Version},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.os, p.arch, variant(p)
	cf.Created = v1.Time{Time: st.Time}
	cf.Config = v1.Config{
		Entrypoint: []string{binPath},
		User:       nonRoot + ":" + nonRoot,
		Env:        []string{"PATH=/usr/bin", "TMPDIR=/tmp"},
		WorkingDir: "/",
		Labels:     imageLabels(st),
	}
	return mutate.ConfigFile(img, cf)
}

func variant(p platform) string {
	if p.arch == "arm64" {
		return "v8"
	}
	return ""
}

// imageLabels are the OCI annotations' keys as labels: what `ctr image
// inspect`, `crictl inspecti` and podman show.
func imageLabels(st stamp) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "kube-etcd-migrate",
		"org.opencontainers.image.description": "rewrite Kubernetes objects in etcd to the current storage version and encryption key, offline",
		"org.opencontainers.image.version":     st.Version,
		"org.opencontainers.image.revision":    st.Commit,
		"org.opencontainers.image.created":     st.Time.Format("2006-01-02T15:04:05Z"),
	}
}

// writeImage writes the image of the binary for p as an OCI image layout in a
// tar file (what `ctr images import` and `podman load` read), named so that
// containerd and podman import it as localhost/kube-etcd-migrate:VERSION.
func writeImage(dir, work string, bin []byte, p platform, st stamp) (string, error) {
	img, err := image(bin, p, st)
	if err != nil {
		return "", err
	}
	layoutDir := filepath.Join(work, "oci-"+p.arch)
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return "", err
	}
	platform := v1.Platform{OS: p.os, Architecture: p.arch, Variant: variant(p)}
	if err := lp.AppendImage(img, layout.WithPlatform(platform), layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": imageName(st),
		"io.containerd.image.name":          imageName(st),
	})); err != nil {
		return "", err
	}
	name := fmt.Sprintf("kube-etcd-migrate-%s-%s.oci.tar", p.os, p.arch)
	return name, tarTree(layoutDir, filepath.Join(dir, name), st)
}

// tarTree writes the files under root into a tar file, sorted, with the
// commit's time and no owner: the same bytes for the same tree.
func tarTree(root, out string, st stamp) error {
	var paths []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != root {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(paths)
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	werr := func() error {
		for _, path := range paths {
			fi, err := os.Lstat(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: st.Time, Format: tar.FormatPAX, Mode: 0o644, Typeflag: tar.TypeReg, Size: fi.Size()}
			if fi.IsDir() {
				h.Name, h.Mode, h.Typeflag, h.Size = h.Name+"/", 0o755, tar.TypeDir, 0
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if !fi.IsDir() {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				if _, err := tw.Write(b); err != nil {
					return err
				}
			}
		}
		return tw.Close()
	}()
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}
