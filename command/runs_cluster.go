package command

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/writerun"
)

// clusterSource is etcd's connection as 'runs' takes it: asked only when
// the operator gave one (etcd's flags, on the command line or in the
// environment, or --apiserver-manifest / --apiserver-flags-file), so that
// the plain listing stays local and fast.
type clusterSource struct {
	etcd etcdOptions
	api  apiServerOptions
	prov provenance
}

func newClusterSource(c *cli.Context) clusterSource {
	return clusterSource{etcd: newEtcdOptions(c), api: newAPIServerOptions(c), prov: newProvenance(c)}
}

// given says whether the operator named an etcd to ask.
func (s clusterSource) given() bool {
	if s.api.manifest != "" || s.api.flagsFile != "" {
		return true
	}
	for _, f := range []string{"endpoints", "cacert", "cert", "key", "user", "password"} {
		if s.prov.onCommandLine(f) || s.prov.fromEnvironment(f) != "" {
			return true
		}
	}
	return false
}

func (s clusterSource) validate() error {
	if !s.given() {
		return nil
	}
	if err := s.api.validate(); err != nil {
		return err
	}
	return s.etcd.validate()
}

// notAsked is what 'runs' says when no etcd was named.
const notAsked = "this host's runs only: give etcd's connection flags (--endpoints, --cacert, --cert, --key) or --apiserver-manifest to list the cluster's runs from every host"

// open connects to etcd when one was named: nil and why not otherwise (a
// connection that fails is a note, not an error: the local runs are listed).
func (s clusterSource) open(ctx context.Context, w io.Writer) (*clientv3.Client, string) {
	if !s.given() {
		return nil, notAsked
	}
	cli, err := connect(ctx, w, s.etcd, s.prov, s.api)
	if err != nil {
		return nil, "this host's runs only: etcd not reached (" + cliMessage(err) + ")"
	}
	return cli, ""
}

// clusterRuns are the cluster's runs as etcd records them (the cluster's lock).
type clusterRuns struct {
	Runs []clusterRun `json:"runs"`
	// Holder is the run holding the cluster's lock now (none: absent).
	Holder *writerun.ClusterRun `json:"holder,omitempty"`
	// raw are the runs as etcd records them.
	raw []writerun.ClusterRun
}

// clusterRun is one of the cluster's runs, with its state: running (it
// holds the cluster's lock), finished, or unfinished (no end recorded and
// no lock: killed, or etcd was restored from a snapshot taken during it).
type clusterRun struct {
	writerun.ClusterRun
	State string `json:"state"`
}

// readClusterRuns reads the cluster's runs: nil and a note when etcd was
// not named, not reached, or refuses the tool's keys (auth).
func (s clusterSource) readClusterRuns(ctx context.Context, w io.Writer) (*clusterRuns, string) {
	cli, note := s.open(ctx, w)
	if cli == nil {
		return nil, note
	}
	defer cli.Close()
	return listClusterRuns(ctx, cli)
}

func listClusterRuns(ctx context.Context, cli *clientv3.Client) (*clusterRuns, string) {
	runs, holder, err := writerun.ClusterRuns(ctx, cli)
	if err != nil {
		var np *writerun.NotPermittedError
		if errors.As(err, &np) {
			return nil, "this host's runs only: " + np.Error()
		}
		return nil, "this host's runs only: " + err.Error()
	}
	out := &clusterRuns{raw: runs, Holder: holder}
	for _, r := range runs {
		state := "unfinished"
		switch {
		case r.Finished():
			state = "finished"
		case out.Holder != nil && out.Holder.Revision == r.Revision:
			state = "running"
		}
		out.Runs = append(out.Runs, clusterRun{r, state})
	}
	return out, ""
}

// table writes the cluster's runs after the local ones.
func (c *clusterRuns) table(w io.Writer) error {
	if len(c.Runs) == 0 {
		fmt.Fprintln(w, "the cluster's runs (etcd, every host): none recorded")
		return nil
	}
	fmt.Fprintln(w, "the cluster's runs (etcd, every host), in the order they took the cluster's lock:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCOMMAND\tSTATE\tHOST\tPID\tSTATE DIRECTORY\tSTARTED\tENDED\tEXIT\tKEYS WRITTEN")
	for _, r := range c.Runs {
		ended, exit := "-", "-"
		if r.Finished() {
			ended, exit = r.End.Local().Format(time.DateTime), fmt.Sprint(*r.ExitCode)
		}
		dir := r.StateDir
		if dir == "" {
			dir = "none (--no-undo)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\n", r.ID, r.Command, r.State, r.Host, r.PID, dir, r.Start.Local().Format(time.DateTime), ended, exit, r.KeysWritten)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if h := c.Holder; h != nil {
		fmt.Fprintf(w, "holding the cluster's lock now: run %s, pid %d on %s (state directory %s)\n", h.ID, h.PID, h.Host, h.UndoPlace())
	}
	var unfinished []string
	for _, r := range c.Runs {
		if r.State == "unfinished" {
			unfinished = append(unfinished, r.ID+" on "+r.Host)
		}
	}
	if len(unfinished) > 0 {
		fmt.Fprintf(w, "no end recorded: %s (killed, or etcd was restored from a snapshot taken while it ran): its host's 'runs' says more\n", strings.Join(unfinished, ", "))
	}
	return nil
}
