package apiserverconfig

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"
	apiserveroptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/kubernetes/pkg/controlplane"
	"k8s.io/kubernetes/pkg/kubeapiserver"
)

// Etcd is one etcd cluster kube-apiserver keeps objects in.
type Etcd struct {
	// Name is "" for the main etcd (--etcd-servers), else the resources
	// --etcd-servers-overrides moves to this one, as it names them
	// ("events", "events,leases.coordination.k8s.io"): what the undo files
	// and reports of this etcd are named by.
	Name string
	// Servers are its client URLs.
	Servers []string
	// Resources are the resources kube-apiserver keeps there: an
	// override's (nil for the main etcd, which keeps every other one).
	Resources []schema.GroupResource
}

// Main says whether e is the main etcd (--etcd-servers).
func (e Etcd) Main() bool { return e.Name == "" }

// Label names e for messages: "main etcd" or "etcd of events".
func (e Etcd) Label() string {
	if e.Main() {
		return "main etcd"
	}
	return "etcd of " + e.Name
}

// ResourceNames are e's resources as --resource takes them.
func (e Etcd) ResourceNames() []string {
	out := make([]string, len(e.Resources))
	for i, gr := range e.Resources {
		out[i] = gr.String()
	}
	return out
}

// Etcds are the etcds of a cluster and which resources each holds: the main
// one (--etcd-servers) first, then one per server list of
// --etcd-servers-overrides, in the order the flag names them. A cluster
// without overrides has one.
type Etcds []Etcd

// Split says whether the cluster keeps resources in more than one etcd.
func (es Etcds) Split() bool { return len(es) > 1 }

// Moved are the resources kept outside the main etcd.
func (es Etcds) Moved() []schema.GroupResource {
	var out []schema.GroupResource
	for _, e := range es[1:] {
		out = append(out, e.Resources...)
	}
	return out
}

// MovedNames are Moved as --resource takes them.
func (es Etcds) MovedNames() []string {
	var out []string
	for _, e := range es[1:] {
		out = append(out, e.ResourceNames()...)
	}
	return out
}

// Etcds are the etcds the command line names: --etcd-servers and
// --etcd-servers-overrides, read by kube-apiserver's own parser and storage
// factory. A resource is moved where the storage factory puts it (an
// override kube-apiserver does not apply, such as one naming the
// events.k8s.io resource its core cohabitant stores, is an error: the
// operator expects it to matter). An override to the main etcd's own
// servers moves nothing. The servers of the main etcd are c.EtcdServers
// (which the tool's --endpoints may have replaced).
func (c *Config) Etcds() (Etcds, error) {
	es := Etcds{{Servers: c.EtcdServers}}
	if c.opts == nil || len(c.opts.Etcd.EtcdServersOverrides) == 0 {
		return es, nil
	}
	name := orDefault(c.File, "kube-apiserver flags")
	overrides, err := apiserveroptions.ParseEtcdServersOverrides(c.opts.Etcd.EtcdServersOverrides)
	if err != nil {
		return nil, fmt.Errorf("%s: --etcd-servers-overrides: %w", name, err)
	}
	// kube-apiserver's storage factory, built as it builds it from these
	// options: it says where each resource is kept.
	sfc := kubeapiserver.NewStorageFactoryConfig()
	sfc.APIResourceConfig = controlplane.DefaultAPIResourceConfigSource()
	factory, err := sfc.Complete(c.opts.Etcd).New()
	if err != nil {
		return nil, fmt.Errorf("%s: --etcd-servers-overrides: %w", name, err)
	}
	mainServers := c.opts.Etcd.StorageConfig.Transport.ServerList
	for _, o := range overrides {
		flag := fmt.Sprintf("%s: --etcd-servers-overrides %s#%s", name, o.GroupResource, strings.Join(o.Servers, ";"))
		if o.GroupResource.Resource == "*" {
			return nil, fmt.Errorf("%s: a whole group in another etcd is not supported; name its resources", flag)
		}
		cfg, err := factory.NewConfig(o.GroupResource, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: kube-apiserver stores no such built-in resource: %w", flag, err)
		}
		servers := cfg.Transport.ServerList
		if !slices.Equal(servers, o.Servers) {
			return nil, fmt.Errorf("%s: kube-apiserver does not apply it (the resource is stored with another, kept in %s); name the resource it is stored with", flag, strings.Join(servers, ";"))
		}
		if slices.Equal(servers, mainServers) {
			continue
		}
		i := slices.IndexFunc(es[1:], func(e Etcd) bool { return slices.Equal(e.Servers, servers) }) + 1
		if i == 0 {
			es = append(es, Etcd{Servers: servers})
			i = len(es) - 1
		}
		if !slices.Contains(es[i].Resources, o.GroupResource) {
			es[i].Resources = append(es[i].Resources, o.GroupResource)
		}
	}
	for i := range es[1:] {
		es[i+1].Name = strings.Join(es[i+1].ResourceNames(), ",")
	}
	return es, nil
}

// ServersOverrides is --etcd-servers-overrides as the command line gives
// it, nil when not set.
func (c *Config) ServersOverrides() []string {
	if c.opts == nil {
		return nil
	}
	return c.opts.Etcd.EtcdServersOverrides
}
