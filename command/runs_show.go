package command

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/internal/buildinfo"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/snapshotdb"
	"kube-etcd-migrate/writerun"
)

// runShow is 'runs --show ID': the run's record, and how to undo it: the
// rollback of the tool's writes, and the restore of the run's snapshot on
// every etcd member.
func (o *runsOptions) runShow() error {
	recs, err := o.stateDir.List()
	if err != nil {
		return fmt.Errorf("--state-dir: %w", err)
	}
	var rec *writerun.Record
	for i, r := range recs {
		if r.ID == o.show || strconv.Itoa(r.Seq) == strings.TrimLeft(o.show, "0") {
			rec = &recs[i]
		}
	}
	if rec == nil {
		return usageErr("--show: %v", &writerun.NotFoundError{ID: o.show, StateDir: string(o.stateDir)})
	}
	ctx, stop := signalContext(o.io.errOut)
	defer stop()
	rep := showReport{Shown: *rec, StateDir: o.stateDir}
	for _, r := range recs {
		if r.Seq > rec.Seq {
			rep.Later = append(rep.Later, r.ID)
		}
	}
	// The members and later runs elsewhere, from etcd when it was named.
	var members []restoreMember
	membersFrom := ""
	cli, note := o.cluster.open(ctx, o.io.errOut)
	if cli != nil {
		defer cli.Close()
		members, membersFrom = etcdMembers(ctx, cli)
		if cluster, cnote := listClusterRuns(ctx, cli); cluster != nil {
			rep.Elsewhere = writerun.LaterElsewhere(cluster.raw, *rec, absDir(string(o.stateDir)))
		} else {
			rep.ClusterNote = cnote
		}
	} else {
		rep.ClusterNote = note
	}
	rep.Restore = restorePlanFor(*rec, o.cluster.api.manifest, members, membersFrom)
	return printReport(o.io.out, o.output, rep)
}

// showReport is one run and how to undo it.
type showReport struct {
	Shown    writerun.Record   `json:"run"`
	StateDir writerun.StateDir `json:"stateDir"`
	// Later are the later runs of the state directory a rollback of this
	// one undoes with it.
	Later []string `json:"later,omitempty"`
	// Elsewhere are the cluster's runs on other hosts (or state
	// directories) after this one: undo those first, where they are kept.
	Elsewhere   []writerun.ClusterRun `json:"elsewhere,omitempty"`
	ClusterNote string                `json:"clusterNote,omitempty"`
	Restore     *restorePlan          `json:"restore,omitempty"`
}

func (r showReport) stamped(build buildinfo.Info) any {
	return struct {
		Build buildinfo.Info `json:"build"`
		showReport
	}{build, r}
}

func (r showReport) table(w io.Writer) error {
	v := r.Shown
	fmt.Fprintf(w, "run %s\n", v.ID)
	row := func(name, format string, args ...any) {
		fmt.Fprintf(w, "  %-14s %s\n", name, fmt.Sprintf(format, args...))
	}
	cmd := v.Command
	if len(v.Undoes) > 0 {
		cmd += fmt.Sprintf(" (undoes %s)", strings.Join(v.Undoes, ", "))
	}
	row("command", "%s", cmd)
	row("host", "%s (pid %d)", v.Host, v.PID)
	row("started", "%s", v.Start.Local().Format(time.DateTime))
	if v.Finished() {
		row("ended", "%s, exit code %d", v.End.Local().Format(time.DateTime), *v.ExitCode)
	} else {
		row("ended", "no end recorded (running, or killed: 'runs' says which)")
	}
	row("keys written", "%d", v.KeysWritten)
	if len(v.Endpoints) > 0 {
		row("etcd", "%s (prefix %s)", strings.Join(v.Endpoints, ","), v.Prefix)
	}
	row("directory", "%s", v.Dir)
	journal := "none"
	if fi, err := os.Stat(v.Journal); v.Journal != "" && err == nil {
		journal = fmt.Sprintf("%s (%s", v.Journal, textfmt.Bytes(fi.Size()))
		if v.JournalSum != nil {
			journal += ", sha256 " + v.JournalSum.SHA256 + " recorded at its end"
		}
		journal += ")"
	} else if v.Journal != "" {
		journal = v.Journal + " (not on disk)"
	}
	row("journal", "%s", journal)
	snap := "none"
	if p := r.Restore; p != nil && p.Snapshot != "" {
		snap = fmt.Sprintf("%s (%s, sha256 %s, %s)", p.Snapshot, textfmt.Bytes(p.Bytes), p.SHA256, p.SHA256From)
	} else if v.Snapshot != "" {
		snap = v.Snapshot + " (not on disk)"
	}
	row("snapshot", "%s", snap)
	if len(v.UndoNeedsKeys) > 0 {
		row("undo needs", "%s (kube-apiserver's encryption configuration must read them)", strings.Join(v.UndoNeedsKeys, ","))
	}
	// The run's undo in the cluster's other etcds (--etcd-servers-overrides).
	for _, e := range v.Etcds {
		row("etcd "+e.Name, "%s", strings.Join(e.Endpoints, ","))
		onDisk := func(path string, sum *writerun.FileSum) string {
			fi, err := os.Stat(path)
			switch {
			case path == "":
				return "none"
			case err != nil:
				return path + " (not on disk)"
			case sum != nil:
				return fmt.Sprintf("%s (%s, sha256 %s recorded at its end)", path, textfmt.Bytes(fi.Size()), sum.SHA256)
			}
			return fmt.Sprintf("%s (%s)", path, textfmt.Bytes(fi.Size()))
		}
		row("  journal", "%s", onDisk(e.Journal, e.JournalSum))
		row("  snapshot", "%s", onDisk(e.Snapshot, e.SnapshotSum))
	}

	fmt.Fprintln(w)
	with := "it"
	if len(r.Later) > 0 {
		with = "it and the later runs " + strings.Join(r.Later, ", ")
	}
	fmt.Fprintf(w, "Undo %s, the tool's writes only (keys changed since by anyone else are left):\n", with)
	fmt.Fprintf(w, "  kube-etcd-migrate rollback --run %s --state-dir %s --dry-run, then without --dry-run\n", v.ID, r.StateDir)
	for _, e := range r.Elsewhere {
		fmt.Fprintf(w, "  first, on %s: run %s (%s) of state directory %s came after it: undo it there ('kube-etcd-migrate rollback --run %s --state-dir %s')\n", e.Host, e.ID, e.Command, e.UndoPlace(), e.ID, e.UndoPlace())
	}
	if r.ClusterNote != "" {
		fmt.Fprintf(w, "  (runs on other hosts after it: not known: %s)\n", strings.TrimPrefix(r.ClusterNote, "this host's runs only: "))
	}
	fmt.Fprintln(w)
	p := r.Restore
	if p == nil || p.Snapshot == "" {
		fmt.Fprintf(w, "No snapshot of the state before it is on disk: restore the last backup from before %s.\n", v.Start.Local().Format(time.DateTime))
		return nil
	}
	fmt.Fprintln(w, "Or restore all of etcd to the state before it, on every member (everything written since, by anyone, is lost):")
	for _, line := range p.Commands {
		fmt.Fprintln(w, line)
	}
	for _, n := range p.Notes {
		fmt.Fprintln(w, "note: "+n)
	}
	return nil
}

// restorePlan is how the run's snapshot becomes every member's data again
// (docs/runbooks.md: restoring a run's snapshot on every member).
type restorePlan struct {
	Snapshot string `json:"snapshot"`
	Bytes    int64  `json:"bytes"`
	SHA256   string `json:"sha256"`
	// SHA256From says whether SHA256 was recorded at the run's end or
	// computed now (a run that recorded none).
	SHA256From string          `json:"sha256From"`
	Members    []restoreMember `json:"members"`
	// MembersFrom says where the members came from; DataDir (on every
	// member's host) and where it came from.
	MembersFrom    string `json:"membersFrom"`
	InitialCluster string `json:"initialCluster"`
	DataDir        string `json:"dataDir"`
	DataDirFrom    string `json:"dataDirFrom"`
	// Token is the new cluster's --initial-cluster-token (one per
	// restore, the same on every member).
	Token string `json:"initialClusterToken"`
	// Commands are the steps as printed; Notes what they assume.
	Commands []string `json:"commands"`
	Notes    []string `json:"notes,omitempty"`
}

// restoreMember is one etcd member, as its restore needs it.
type restoreMember struct {
	Name    string `json:"name"`
	PeerURL string `json:"peerURL"`
	// Host is where its commands run (the peer URL's host); This: this
	// node's member (its snapshot is already here).
	Host string `json:"host"`
	This bool   `json:"this,omitempty"`
	// Placeholder: the values are to be filled in.
	Placeholder bool `json:"placeholder,omitempty"`
}

// restoreBump is the restore's --bump-revision: past every revision a
// client (a controller's watch, a kubelet) saw before the restore.
const restoreBump = 1_000_000_000

// Placeholders, in the commands where a value is not known.
const (
	phName    = "<MEMBER_NAME>"
	phPeer    = "<PEER_URL>"
	phHost    = "<NODE>"
	phCluster = "<NAME1=PEER_URL1,NAME2=PEER_URL2,...>"
	phDataDir = "<DATA_DIR>"
)

// etcdMembers are the members etcd lists (learners left out: they join
// again after the restore).
func etcdMembers(ctx context.Context, cli *clientv3.Client) ([]restoreMember, string) {
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return nil, ""
	}
	var out []restoreMember
	for _, m := range resp.Members {
		if m.IsLearner || len(m.PeerURLs) == 0 || m.Name == "" {
			continue
		}
		out = append(out, restoreMember{Name: m.Name, PeerURL: m.PeerURLs[0], Host: hostOf(m.PeerURLs[0])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, "etcd's member list"
}

func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Hostname() == "" {
		return phHost
	}
	return p.Hostname()
}

// thisMember reads this node's etcd manifest: beside --apiserver-manifest,
// else kubeadm's when it is there.
func thisMember(apiserverManifest string) (apiserverconfig.EtcdMember, bool) {
	file := writerun.KubeadmEtcdManifest
	if apiserverManifest != "" {
		f, err := apiserverconfig.EtcdManifestBeside(apiserverManifest)
		if err != nil {
			return apiserverconfig.EtcdMember{}, false
		}
		file = f
	}
	if _, err := os.Stat(file); err != nil {
		return apiserverconfig.EtcdMember{}, false
	}
	m, err := apiserverconfig.ReadEtcdMember(file)
	return m, err == nil
}

// restorePlanFor is the restore of rec's snapshot on every member: the
// members from etcd (members, when it answered), else from this node's etcd
// manifest's --initial-cluster, else placeholders.
func restorePlanFor(rec writerun.Record, apiserverManifest string, members []restoreMember, membersFrom string) *restorePlan {
	if !rec.SnapshotTaken() {
		return nil
	}
	p := &restorePlan{Snapshot: rec.Snapshot}
	if s := rec.SnapshotSum; s != nil {
		p.Bytes, p.SHA256, p.SHA256From = s.Bytes, s.SHA256, "recorded at the run's end"
	} else if d, err := snapshotdb.Digest(rec.Snapshot); err == nil {
		p.Bytes, p.SHA256, p.SHA256From = d.Size, d.SHA256, "computed now: its run recorded none"
	} else {
		p.SHA256, p.SHA256From = "<SHA256>", "not known: "+err.Error()
	}
	p.Token = "etcd-restore-" + rec.ID
	here, known := thisMember(apiserverManifest)
	if known {
		if here.HostDataDir != "" {
			p.DataDir, p.DataDirFrom = here.HostDataDir, "--data-dir of "+here.File+" (kubeadm gives every member the same)"
		}
	}
	if len(members) == 0 && known && here.InitialCluster != "" {
		for _, kv := range strings.Split(here.InitialCluster, ",") {
			name, peer, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if ok {
				members = append(members, restoreMember{Name: name, PeerURL: peer, Host: hostOf(peer)})
			}
		}
		membersFrom = "--initial-cluster of " + here.File + " (a member that joined after this one is not in it: check 'etcdctl member list')"
	}
	if len(members) == 0 {
		members = []restoreMember{{Name: phName, PeerURL: phPeer, Host: phHost, Placeholder: true}}
		membersFrom = "not known: etcd was not asked and this node has no etcd manifest"
		p.Notes = append(p.Notes, "<...> are placeholders: fill them in, one block per member, from 'etcdctl member list -w table' and each member's etcd.yaml (--name, --initial-advertise-peer-urls, --data-dir)")
	}
	if p.DataDir == "" {
		p.DataDir, p.DataDirFrom = phDataDir, "not known: no etcd manifest on this node"
		if !members[0].Placeholder {
			p.Notes = append(p.Notes, "<DATA_DIR> is a placeholder: each member's --data-dir on its host (kubeadm: /var/lib/etcd)")
		}
	}
	var cluster []string
	for i := range members {
		if known && members[i].Name == here.Name {
			members[i].This = true
		}
		cluster = append(cluster, members[i].Name+"="+members[i].PeerURL)
	}
	p.Members, p.MembersFrom = members, membersFrom
	p.InitialCluster = strings.Join(cluster, ",")
	if members[0].Placeholder {
		p.InitialCluster = phCluster
	}
	p.Commands = restoreCommands(rec, p)
	p.Notes = append(p.Notes, "members: "+membersFrom, "data directory: "+p.DataDirFrom,
		"etcdutl is etcd's own tool, of the release etcd runs (from etcd's release tarball: kubeadm installs none on the host); the commands for another member run on that member's host, as root",
		"--bump-revision and --mark-compacted move etcd's revision past every revision a client saw before, so that watches restart cleanly ('etcdutl snapshot restore --help' shows whether yours has them; without them, leave both out)")
	return p
}

// restoreCommands are the steps of the restore, as an operator types them.
func restoreCommands(rec writerun.Record, p *restorePlan) []string {
	id := rec.ID
	restored := p.DataDir + ".restore-" + id
	var out []string
	step := func(format string, args ...any) { out = append(out, "  "+fmt.Sprintf(format, args...)) }
	cmd := func(format string, args ...any) { out = append(out, "      "+fmt.Sprintf(format, args...)) }
	step("1. On every control-plane node, stop kube-apiserver, then etcd: move kube-apiserver.yaml, then etcd.yaml, out of /etc/kubernetes/manifests, and wait until 'crictl ps' shows neither.")
	step("2. Copy the snapshot to each member and check it there (the checksum must match before it is used):")
	for _, m := range p.Members {
		if m.This {
			cmd("# %s (this node): the snapshot is here", m.Name)
			cmd("sha256sum %s    # must print %s", p.Snapshot, p.SHA256)
			continue
		}
		cmd("# %s", m.Name)
		cmd("ssh %s install -d -m 0700 %s", m.Host, filepath.Dir(p.Snapshot))
		cmd("scp %s %s:%s", p.Snapshot, m.Host, p.Snapshot)
		cmd("ssh %s sha256sum %s    # must print %s", m.Host, p.Snapshot, p.SHA256)
	}
	step("3. On each member, restore it into a new data directory, the same --initial-cluster and token on every member (etcdutl checks the snapshot's own sha256 trailer too):")
	for _, m := range p.Members {
		where := m.Host
		if m.This {
			where = "this node"
		}
		cmd("# on %s", where)
		cmd("etcdutl snapshot restore %s --name %s --initial-cluster %s --initial-advertise-peer-urls %s --initial-cluster-token %s --bump-revision %d --mark-compacted --data-dir %s",
			p.Snapshot, m.Name, p.InitialCluster, m.PeerURL, p.Token, restoreBump, restored)
	}
	step("4. On each member, keep the old data directory aside and put the restored one in its place, then start etcd (etcd.yaml back):")
	cmd("mv %s %s.before-%s && mv %s %s", p.DataDir, p.DataDir, id, restored, p.DataDir)
	step("5. When 'etcdctl endpoint status --cluster' shows every member and one leader, put kube-apiserver.yaml back on every node, then check: kube-etcd-migrate verify")
	return out
}

// absDir is dir made absolute (as the state directory records itself).
func absDir(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}
