// Package buildinfo says which build a binary is, so that an operator can tell,
// before pointing it at production, and an audit can tell afterwards, which
// release judged the objects: the tool's semantic version (Release, the latest
// released entry of CHANGELOG.md, or what `make release` stamps with -ldflags
// "-X kube-etcd-migrate/internal/buildinfo.version=v1.2.3", which it checks is
// the same), whether the binary is that release's own build or a development
// build of its source or a later commit, the commit (the VCS stamp the Go
// toolchain writes, or the one `make release` stamps), the Kubernetes release
// whose scheme and storage factory it carries (the version of module
// k8s.io/kubernetes it was built with, from the same build information, never a
// constant typed by hand), the etcd client version and the Go version.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	etcdversion "go.etcd.io/etcd/api/v3/version"
)

// Release is this source's version of kube-etcd-migrate: the latest released
// entry of CHANGELOG.md (a test checks they agree). A commit after a release
// keeps the release's number until the next one is cut; its binary says it is a
// development build (Info.Development). Cutting a release: docs/releasing.md.
const Release = "v0.2.0"

// version and commit are set by `make release` with -ldflags -X (it builds a
// clean copy of the commit, without VCS information, and stamps Release, having
// checked it against CHANGELOG.md); empty in other builds.
var version, commit string

// KubernetesModule is the module whose scheme, conversions, defaulting and storage
// factory the tool runs.
const KubernetesModule = "k8s.io/kubernetes"

// Unknown is reported for what the binary does not record (a build without
// module information).
const Unknown = "unknown"

// Info identifies a build. Version and Kubernetes go into every JSON report and
// metrics file.
type Info struct {
	// Version of kube-etcd-migrate, a semantic version (v1.2.3): the -ldflags
	// stamp of `make release`, else Release.
	Version string `json:"version"`
	// Development is set in every binary `make release` did not build (make
	// build, go build, go run): the source of Version or of a later commit,
	// which Commit and Modified name.
	Development bool `json:"development,omitempty"`
	// Kubernetes is the k8s.io/kubernetes module version (v1.37.2).
	Kubernetes string `json:"kubernetes"`
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
		EtcdClient: etcdversion.Version,
		Go:         runtime.Version(),
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi != nil {
		for _, d := range bi.Deps {
			if d.Path != KubernetesModule {
				continue
			}
			info.Kubernetes = d.Version
			if d.Replace != nil && d.Replace.Version != "" {
				info.Kubernetes = d.Replace.Version
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
	} else {
		info.Development = true
	}
	if stampedCommit != "" && info.Commit == "" {
		info.Commit = stampedCommit
	}
	return info
}
