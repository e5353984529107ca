// Package buildinfo says which build a binary is, so that an operator can tell,
// before pointing it at production, and an audit can tell afterwards, which
// release judged the objects: the tool's own version (set at link time with
// -ldflags "-X kube-etcd-migrate/internal/buildinfo.version=v1.2.3", otherwise the
// version and VCS stamp the Go toolchain writes into every binary), the Kubernetes
// release whose scheme and storage factory it carries (the version of module
// k8s.io/kubernetes it was built with, from the same build information, never a
// constant typed by hand), the etcd client version and the Go version.
package buildinfo

import (
	"runtime"
	"runtime/debug"

	etcdversion "go.etcd.io/etcd/api/v3/version"
)

// version and commit are set by `make release` with -ldflags -X (it builds a
// clean copy of the commit, without VCS information); empty in other builds.
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
	// Version of kube-etcd-migrate: the -ldflags stamp, else the module version
	// the Go toolchain derived from the VCS (a tag, or a pseudo-version with
	// "+dirty" for uncommitted changes), else "devel".
	Version string `json:"version"`
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
		Version:    "devel",
		Kubernetes: Unknown,
		EtcdClient: etcdversion.Version,
		Go:         runtime.Version(),
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi != nil {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			info.Version = v
		}
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
	}
	if stampedCommit != "" && info.Commit == "" {
		info.Commit = stampedCommit
	}
	return info
}
