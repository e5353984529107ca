package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // the deb packager
	"github.com/goreleaser/nfpm/v2/files"
	_ "github.com/goreleaser/nfpm/v2/rpm" // the rpm packager
)

// What the packages install, and where.
const (
	binPath     = "/usr/bin/kube-etcd-migrate"
	manPath     = "/usr/share/man/man1/kube-etcd-migrate.1.gz"
	bashPath    = "/usr/share/bash-completion/completions/kube-etcd-migrate"
	zshDebPath  = "/usr/share/zsh/vendor-completions/_kube-etcd-migrate" // Debian's zsh
	zshRPMPath  = "/usr/share/zsh/site-functions/_kube-etcd-migrate"     // Fedora's, RHEL's
	stateDir    = "/var/lib/kube-etcd-migrate"
	packageName = "kube-etcd-migrate"
)

// The files of the source tree the packages carry beside the binary: what
// `make docs` writes from the CLI's definitions (internal/build/docgen).
const (
	srcManPage = "packaging/kube-etcd-migrate.1"
	srcBash    = "packaging/kube-etcd-migrate.bash"
	srcZsh     = "packaging/_kube-etcd-migrate"
)

const description = `rewrite Kubernetes objects in etcd to the current storage version and encryption key, offline
kube-etcd-migrate reads every object kube-apiserver stored in etcd, decrypts
and decodes it as kube-apiserver does, and rewrites the stale ones (an old
storage version, an old encryption key) through the apiserver's own code,
while every kube-apiserver is stopped; verify is a read-only audit whose exit
code gates a runbook. Every writing run keeps its undo in
/var/lib/kube-etcd-migrate (mode 0700).`

// packageFiles are the contents of the deb and the rpm: the binary, the man
// page (gzipped as the distributions ship them), bash and zsh completion,
// and the state directory, private to root.
func packageFiles(bin, work, src string, st stamp) (files.Contents, error) {
	man, err := os.ReadFile(filepath.Join(src, srcManPage))
	if err != nil {
		return nil, fmt.Errorf("the man page %s (make docs writes it): %w", srcManPage, err)
	}
	manGz := filepath.Join(work, "kube-etcd-migrate.1.gz")
	if err := os.WriteFile(manGz, gzipped(man), 0o644); err != nil {
		return nil, err
	}
	for _, f := range []string{srcBash, srcZsh} {
		if _, err := os.Stat(filepath.Join(src, f)); err != nil {
			return nil, fmt.Errorf("the completion file %s (make docs writes it): %w", f, err)
		}
	}
	info := func(mode os.FileMode) *files.ContentFileInfo {
		return &files.ContentFileInfo{Owner: "root", Group: "root", Mode: mode, MTime: st.Time}
	}
	return files.Contents{
		{Source: bin, Destination: binPath, FileInfo: info(0o755)},
		{Source: manGz, Destination: manPath, FileInfo: info(0o644)},
		{Source: filepath.Join(src, srcBash), Destination: bashPath, FileInfo: info(0o644)},
		{Source: filepath.Join(src, srcZsh), Destination: zshDebPath, FileInfo: info(0o644), Packager: "deb"},
		{Source: filepath.Join(src, srcZsh), Destination: zshRPMPath, FileInfo: info(0o644), Packager: "rpm"},
		{Destination: stateDir, Type: files.TypeDir, FileInfo: info(0o700)},
	}, nil
}

// gzipped is gzip -9n: no name, no time in the header.
func gzipped(b []byte) []byte {
	var out bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
	_, _ = zw.Write(b)
	_ = zw.Close()
	return out.Bytes()
}

// writePackage writes the deb or rpm (format) of the binary for p into dir
// and returns its file name.
func writePackage(format, dir string, contents files.Contents, p platform, st stamp) (string, error) {
	version, pre := st.packageVersion()
	info := &nfpm.Info{
		Name:          packageName,
		Arch:          p.arch,
		Platform:      p.os,
		Version:       version,
		Prerelease:    pre,
		VersionSchema: "none",
		Section:       "admin",
		Priority:      "optional",
		Maintainer:    "kube-etcd-migrate maintainers",
		Description:   description,
		MTime:         st.Time,
		Overridables: nfpm.Overridables{
			Contents: contents,
			RPM: nfpm.RPM{
				Summary:   "rewrite Kubernetes objects in etcd to the current storage version and encryption key, offline",
				Group:     "Applications/System",
				BuildHost: "kube-etcd-migrate", // not this machine's name: the same bytes everywhere
			},
		},
	}
	if format == "rpm" {
		info.Release = "1"
	}
	info = nfpm.WithDefaults(info)
	packager, err := nfpm.Get(format)
	if err != nil {
		return "", err
	}
	name := packager.ConventionalFileName(info)
	f, err := os.Create(filepath.Join(dir, name))
	if err != nil {
		return "", err
	}
	if err := packager.Package(info, f); err != nil {
		f.Close()
		return "", fmt.Errorf("%s for %s: %w", format, p, err)
	}
	return name, f.Close()
}
