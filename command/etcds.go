package command

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/etcdscan"
)

// A cluster whose kube-apiserver keeps resources in several etcds
// (--etcd-servers-overrides: kops keeps Events in etcd-events) is handled
// etcd by etcd: a session per etcd (scanOptions.only), each reading the
// resources kube-apiserver keeps there, with the same TLS files (as
// kube-apiserver uses --etcd-cafile, --etcd-certfile and --etcd-keyfile for
// every etcd). migrate, rollback, verify and plan loop over
// apiserverconfig.Etcds; the other commands refuse such a cluster
// (splitRefusal).

// clusterEtcds are the etcds of the cluster the options name: the main one
// (--etcd-servers, or the tool's --endpoints), then those of
// --etcd-servers-overrides. --endpoints replaces the main etcd only: the
// override still applies, and a note on w says so. Nil for a
// --snapshot-file (one etcd's copy), and when the configuration is
// refused.
func (o *scanOptions) clusterEtcds(w io.Writer) (apiserverconfig.Etcds, error) {
	if o.snapshotFile != "" {
		return nil, nil
	}
	// What is refused here is refused again, with the lines that go with
	// it, as the session opens (open).
	api, err := o.api.load()
	if err != nil {
		return nil, nil
	}
	if _, err := etcdConfig(o.etcd, o.prov, api, &envReport{}, io.Discard); err != nil {
		return nil, nil
	}
	es, err := api.Etcds()
	if err != nil {
		return nil, nil
	}
	if es.Split() && o.prov.onCommandLine("endpoints") {
		for _, e := range es[1:] {
			fmt.Fprintf(w, "note: --endpoints replaces the main etcd (--etcd-servers) only: %s stay in the etcd --etcd-servers-overrides names (%s)\n", e.Name, strings.Join(e.Servers, ","))
		}
	}
	return es, nil
}

// forEtcd is a copy of o that reads etcd e of es.
func (o *scanOptions) forEtcd(es apiserverconfig.Etcds, e apiserverconfig.Etcd) *scanOptions {
	c := *o
	c.only, c.etcds = &e, es
	return &c
}

// etcdPart is what a session of o reads: the endpoints of its etcd and the
// resources kube-apiserver keeps there, within --resource.
type etcdPart struct {
	endpoints          []string // nil: the main etcd's (ecfg's)
	resources, exclude []string
	// none: --resource names nothing this etcd holds.
	none bool
}

// part is what o reads of the cluster whose etcds are es: everything
// (--resource) when it keeps its resources in one etcd; a refusal when it
// keeps them in several and o.only is not set to one of them (a command that
// does not handle several, or a --snapshot-file).
func (o *scanOptions) part(es apiserverconfig.Etcds, command string) (etcdPart, error) {
	p := etcdPart{resources: o.resources}
	if !es.Split() {
		return p, nil
	}
	if o.only == nil && o.snapshotFile != "" {
		return p, usageErr("--snapshot-file %s: a snapshot is one etcd's, and kube-apiserver keeps resources in several (--etcd-servers-overrides: %s); give the configuration without the manifest or flags file (--encryption-provider-config, --prefix, --target-version)", o.snapshotFile, strings.Join(es.MovedNames(), ", "))
	}
	if o.only == nil {
		return p, splitRefusal(es, command)
	}
	moved := map[string]bool{}
	for _, e := range es[1:] {
		for _, gr := range e.Resources {
			moved[gr.String()] = true
		}
	}
	if o.only.Main() {
		p.exclude = es.MovedNames()
		if len(o.resources) > 0 {
			p.resources = slices.DeleteFunc(slices.Clone(o.resources), func(r string) bool { return moved[canonicalResource(r)] })
			p.exclude = nil // the resources named are read, these are not among them
			p.none = len(p.resources) == 0
		}
		return p, nil
	}
	p.endpoints = o.only.Servers
	p.resources = o.only.ResourceNames()
	if len(o.resources) > 0 {
		p.resources = slices.DeleteFunc(slices.Clone(o.resources), func(r string) bool { return !slices.Contains(o.only.ResourceNames(), canonicalResource(r)) })
		p.none = len(p.resources) == 0
	}
	return p, nil
}

// canonicalResource is --resource's value as GroupResource.String spells
// it ("events", "leases.coordination.k8s.io").
func canonicalResource(r string) string { return strings.ToLower(strings.TrimSpace(r)) }

// splitRefusal refuses a cluster kept in several etcds to a command that
// reads one.
func splitRefusal(es apiserverconfig.Etcds, command string) error {
	var parts []string
	for _, e := range es[1:] {
		parts = append(parts, fmt.Sprintf("%s in %s", e.Name, strings.Join(e.Servers, ",")))
	}
	if command == "" {
		command = "this command"
	}
	return usageErr("--etcd-servers-overrides: kube-apiserver keeps %s, another etcd; %s does not handle a cluster kept in several etcds (verify, plan, migrate and rollback do)", strings.Join(parts, ", "), command)
}

// etcdConfigFor is cfg for etcd part p: its endpoints, the same TLS files.
func etcdConfigFor(cfg etcdscan.Config, p etcdPart) etcdscan.Config {
	if p.endpoints != nil {
		cfg.Endpoints = p.endpoints
	}
	return cfg
}

// etcdSession is one etcd of a cluster kept in several, and the session
// openEtcds opened on it.
type etcdSession struct {
	etcd apiserverconfig.Etcd
	s    *session
}

// openEtcds opens a session, with openOne (open, or openToWrite for a
// command that watches for other writers), on each etcd of es that holds a
// resource the command reads, each announced on stderr (its servers and
// what it holds); the main etcd first, the others reading kubeadm-config
// through its session. What was opened is returned with an error too: the
// caller closes it (closeEtcds).
func (o *scanOptions) openEtcds(ctx context.Context, es apiserverconfig.Etcds, command string, openOne func(context.Context, *scanOptions) (*session, error)) ([]etcdSession, error) {
	var opened []etcdSession
	var kubeadm etcdscan.Source // the main etcd's: kubeadm-config is there
	for _, e := range es {
		so := o.forEtcd(es, e)
		if p, err := so.part(es, command); err != nil {
			return opened, err
		} else if p.none {
			continue
		}
		fmt.Fprintf(o.io.errOut, "%s: %s (%s)\n", e.Label(), strings.Join(e.Servers, ","), etcdHolds(es, e))
		so.kubeadmFrom = kubeadm
		s, err := openOne(ctx, so)
		if err != nil {
			return opened, prefixErr(e.Label(), err)
		}
		if e.Main() {
			kubeadm = s.env.Source
		}
		opened = append(opened, etcdSession{etcd: e, s: s})
	}
	return opened, nil
}

// closeEtcds closes the sessions openEtcds opened.
func closeEtcds(opened []etcdSession) {
	for _, o := range opened {
		o.s.close()
	}
}

// etcdHeading is the line a table report puts above the section of the etcd
// named name ("": the main one).
func etcdHeading(w io.Writer, name string, servers []string) error {
	_, err := fmt.Fprintf(w, "== %s (%s)\n", apiserverconfig.Etcd{Name: name}.Label(), strings.Join(servers, ","))
	return err
}
