// Package buildinfo says which build a binary is, so that an operator can tell,
// before pointing it at production, and an audit can tell afterwards, which
// release judged the objects: the tool's semantic version (Release, the latest
// released entry of CHANGELOG.md, or what `make release` stamps with -ldflags
// "-X kube-etcd-migrate/internal/buildinfo.version=v1.2.3": the release on the
// commit CHANGELOG.md names for it, a development version of the next one,
// v1.2.4-0.TIME-COMMIT, on any other), whether the binary is that release's own
// build or a development build, the commit (the VCS stamp the Go toolchain
// writes, or the one `make release` stamps), the Kubernetes and etcd releases
// whose code it carries (the versions of modules k8s.io/kubernetes and
// go.etcd.io/etcd/server/v3 it was built with, from the same build
// information, never a constant typed by hand), the etcd client API version
// and the Go version.
package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"

	etcdversion "go.etcd.io/etcd/api/v3/version"
)

// Release is this source's version of kube-etcd-migrate: the latest released
// entry of CHANGELOG.md (a test checks they agree). A commit after a release
// keeps the release's number until the next one is cut; its binary says it is a
// development build (Info.Development). Cutting a release: docs/releasing.md.
const Release = "v1.0.0"

// version and commit are set by `make release` with -ldflags -X (it builds a
// clean copy of the commit, without VCS information, and stamps Release, having
// checked it against CHANGELOG.md); empty in other builds.
var version, commit string

// KubernetesModule is the module whose scheme, conversions, defaulting and storage
// factory the tool runs.
const KubernetesModule = "k8s.io/kubernetes"

// EtcdModule is the etcd server module whose code reads and restores snapshot
// files and saves the undo's snapshot (with its client, etcdutl and bbolt of
// the same release).
const EtcdModule = "go.etcd.io/etcd/server/v3"

// Unknown is reported for what the binary does not record (a build without
// module information).
const Unknown = "unknown"

// Info identifies a build. Version and Kubernetes go into every JSON report and
// metrics file.
type Info struct {
	// Version of kube-etcd-migrate, a semantic version (v1.2.3): the -ldflags
	// stamp of `make release`, else Release.
	Version string `json:"version"`
	// Development is set in every binary that is not a release's own: one
	// `make release` did not build (make build, go build, go run: the source
	// of Version or of a later commit, which Commit and Modified name), and
	// one it built of a commit that is not a release (Version is then a
	// pre-release of the next version, v1.2.4-0.TIME-COMMIT).
	Development bool `json:"development,omitempty"`
	// Kubernetes is the k8s.io/kubernetes module version (v1.37.2).
	Kubernetes string `json:"kubernetes"`
	// Etcd is the go.etcd.io/etcd/server/v3 module version (v3.7.3).
	Etcd string `json:"etcd"`
	// Commit, CommitTime and Modified are the VCS stamp, when the build had one.
	Commit     string `json:"commit,omitempty"`
	CommitTime string `json:"commitTime,omitempty"`
	Modified   bool   `json:"modified,omitempty"`
	// EtcdClient is the etcd client (API) version, Go the toolchain and platform.
	EtcdClient string `json:"etcdClient"`
	Go         string `json:"go"`
	Platform   string `json:"platform"`
}

// Get returns this binary's build information.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return fromBuildInfo(bi, version, commit)
}

func fromBuildInfo(bi *debug.BuildInfo, stamped, stampedCommit string) Info {
	info := Info{
		Version:    Release,
		Kubernetes: Unknown,
		Etcd:       Unknown,
		EtcdClient: etcdversion.Version,
		Go:         runtime.Version(),
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi != nil {
		for _, d := range bi.Deps {
			v := d.Version
			if d.Replace != nil && d.Replace.Version != "" {
				v = d.Replace.Version
			}
			switch d.Path {
			case KubernetesModule:
				info.Kubernetes = v
			case EtcdModule:
				info.Etcd = v
			}
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				info.Commit = s.Value
			case "vcs.time":
				info.CommitTime = s.Value
			case "vcs.modified":
				info.Modified = s.Value == "true"
			}
		}
	}
	if stamped != "" {
		info.Version = stamped
	}
	// A release's version is exactly vX.Y.Z; what make release stamps on any
	// other commit has a pre-release part.
	info.Development = stamped == "" || strings.Contains(stamped, "-")
	if stampedCommit != "" && info.Commit == "" {
		info.Commit = stampedCommit
	}
	return info
}
