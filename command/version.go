package command

import (
	"fmt"
	"io"
	"strings"

	"github.com/urfave/cli/v2"

	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/release"
)

// versionReport is what `version` and `--version` print.
type versionReport struct {
	buildinfo.Info
	// KubeAPIServer is the kube-apiserver binary version whose storage the tool
	// reproduces, TargetVersions the --target-version values it accepts (that
	// release and the older ones its emulation reaches), oldest first;
	// DefaultTargetVersion what read-only commands assume when nothing says.
	KubeAPIServer        string   `json:"kubeAPIServer"`
	TargetVersions       []string `json:"targetVersions"`
	DefaultTargetVersion string   `json:"defaultTargetVersion"`
}

func newVersionReport() (versionReport, error) {
	r := versionReport{Info: buildinfo.Get()}
	r.KubeAPIServer = release.Linked()
	r.DefaultTargetVersion = r.KubeAPIServer
	// The same function --target-version goes through says which it accepts.
	r.TargetVersions = release.Versions()
	return r, nil
}

func writeVersion(w io.Writer, format string) error {
	r, err := newVersionReport()
	if err != nil {
		return err
	}
	return printReport(w, format, r)
}

// stamped is the report itself: it is the build's own description.
func (r versionReport) stamped(buildinfo.Info) any { return r }

// table is the text form (-o text).
func (r versionReport) table(w io.Writer) error {
	commit := "none recorded"
	if r.Commit != "" {
		commit = r.Commit
		if r.CommitTime != "" {
			commit += " (" + r.CommitTime + ")"
		}
		if r.Modified {
			commit += ", with uncommitted changes"
		}
	}
	version := r.Version
	switch {
	case r.Development && strings.Contains(r.Version, "-"):
		// make release of a commit that is not a release: the next version's pre-release.
		version += " (a development build of a commit after " + buildinfo.Release + ", not a release binary)"
	case r.Development:
		version += " (a development build: the source of " + r.Version + " or a later commit, not a release binary)"
	}
	_, err := fmt.Fprintf(w, `kube-etcd-migrate %s
  commit:          %s
  kubernetes:      %s (kube-apiserver %s: scheme, storage factory, encryption transformers)
  target versions: %s (--target-version; read-only commands assume %s when nothing says which)
  etcd:            %s (snapshots saved, read and restored with etcd's own code; client API %s)
  go:              %s %s
`, version, commit, r.Kubernetes, r.KubeAPIServer, strings.Join(r.TargetVersions, ", "), r.DefaultTargetVersion, r.Etcd, r.EtcdClient, r.Go, r.Platform)
	return err
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:         "version",
		Usage:        "the tool's version, the Kubernetes release it carries, the target versions it can emulate, the etcd and Go releases it links",
		Flags:        []cli.Flag{outputFlag("text", "text", "json", "yaml")},
		Action:       cmdVersion,
		OnUsageError: commandUsageError,
	}
}

func cmdVersion(c *cli.Context) error {
	if c.NArg() != 0 {
		return usageErr("version takes no arguments")
	}
	return writeVersion(c.App.Writer, c.String("output"))
}
