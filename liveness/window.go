package liveness

import (
	"context"
	"fmt"
	"kube-etcd-migrate/etcdscan"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	coordinationv1 "k8s.io/api/coordination/v1"
)

// checkLeases reads, for the deletes waiting for it, whether the key had an
// etcd lease just before (at the revision before the delete's).
func (w *Watch) checkLeases(ctx context.Context) {
	w.mu.Lock()
	q := w.leaseq
	w.leaseq = nil
	w.mu.Unlock()
	for _, e := range q {
		resp, err := w.cli.Get(ctx, e.key, clientv3.WithRev(e.rev-1))
		w.mu.Lock()
		switch {
		case etcdscan.IsCompacted(err):
			w.mu.Unlock()
			w.fail(fmt.Errorf("liveness: etcd's history was compacted past revision %d (not by this run) before the watch could tell whether the delete of %s was etcd expiring its lease: rerun", e.rev-1, e.key))
			return
		case err != nil:
			// Read again on the loop's next tick.
			w.leaseq = append(w.leaseq, e)
		default:
			e.checking, e.leaseKnown = false, true
			e.leased = len(resp.Kvs) == 1 && resp.Kvs[0].Lease != 0
			w.judge()
		}
		w.mu.Unlock()
	}
}

// decideWindow gives the window's verdict once etcd's watch has reported
// every revision up to the window's end; it says whether the verdict is in.
func (w *Watch) decideWindow(ctx context.Context) bool {
	w.mu.Lock()
	if w.report != nil || w.reportErr != nil {
		w.mu.Unlock()
		return true
	}
	if w.windowEnd == 0 || w.seen < w.windowEnd {
		w.mu.Unlock()
		return false
	}
	rep := &Report{Prefix: w.prefix, Window: w.window, FromRevision: w.from, ToRevision: w.windowEnd, Expired: w.expired}
	for _, wr := range w.byKey {
		rep.Written = append(rep.Written, *wr)
	}
	w.mu.Unlock()
	sort.Slice(rep.Written, func(i, j int) bool {
		a, b := rep.Written[i], rep.Written[j]
		if (a.Kind == Other) != (b.Kind == Other) {
			return a.Kind != Other
		}
		return a.Key < b.Key
	})
	err := heldMasterLeases(ctx, w.cli, w.keys, rep)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.reportErr = err
	} else {
		w.report = rep
	}
	close(w.verdict)
	w.signal()
	return true
}

// heldMasterLeases adds the master leases whose etcd lease has time left.
func heldMasterLeases(ctx context.Context, cli *clientv3.Client, keys string, rep *Report) error {
	// Not keys-only: etcd 3.7 answers a keys-only range from its index, without the leases.
	ml, err := cli.Get(ctx, keys+"masterleases/", clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("liveness: read %smasterleases/: %w", keys, err)
	}
	for _, kv := range ml.Kvs {
		if kv.Lease == 0 {
			continue
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return fmt.Errorf("liveness: read the etcd lease of %s: %w", kv.Key, err)
		}
		if ttl.TTL > 0 {
			rep.MasterLeases = append(rep.MasterLeases, HeldMasterLease{Key: string(kv.Key), TTL: ttl.TTL, GrantedTTL: ttl.GrantedTTL})
		}
	}
	return nil
}

// describe fills in what a written value says of its writer: an identity
// lease's kind, node and renewTime (an encrypted or undecodable lease is
// judged by its name).
func describe(prefix string, value []byte, w *Write) {
	if !strings.HasPrefix(w.Key, prefix+"/leases/kube-system/") {
		return
	}
	obj, _, err := leaseDecoder.Decode(value, nil, nil)
	if err != nil {
		return
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	if l.Labels["apiserver.kubernetes.io/identity"] == "kube-apiserver" {
		w.Kind = IdentityLease
	}
	if w.Kind == IdentityLease {
		w.Host = l.Labels["kubernetes.io/hostname"]
		if l.Spec.RenewTime != nil {
			t := l.Spec.RenewTime.Time
			w.RenewTime = &t
		}
	}
}

// WriterError stops a run: etcd showed a write under the prefix, after the
// window, that is not one of the run's own.
type WriterError struct {
	Prefix string
	// Since is the revision the window ended at: the writes named came after it.
	Since int64
	// Writes are the keys written (first seen first), More those past the
	// bound; a delete is one etcd did not make for an expired lease.
	Writes []Write
	More   int
	// APIServers are the kube-apiserver identity leases written since the
	// window began, as etcd held them when the run ended (Settle).
	APIServers []Write
	// Opened, for a datastore watched through its file instead (SQLite
	// served through kine: no one writes it without opening the file),
	// says who opened it mid-run; no key is named then.
	Opened string
}

func (e *WriterError) Error() string {
	if e.Opened != "" {
		return "stopped: a writer appeared: " + e.Opened
	}
	var ws []string
	named := map[string]bool{}
	for i, w := range e.Writes {
		if i == maxListed {
			ws = append(ws, fmt.Sprintf("and %d more", len(e.Writes)-maxListed+e.More))
			break
		}
		named[w.Key] = true
		ws = append(ws, w.atRevision())
	}
	s := fmt.Sprintf("stopped: a writer appeared: etcd shows %d key(s) under %s written after revision %d that are not this run's writes: %s",
		len(e.Writes)+e.More, e.Prefix, e.Since, strings.Join(ws, "; "))
	var as []string
	for _, w := range e.APIServers {
		if named[w.Key] {
			continue
		}
		if len(as) == maxListed {
			as = append(as, "and more")
			break
		}
		as = append(as, w.atRevision())
	}
	if len(as) > 0 {
		s += fmt.Sprintf("; kube-apiserver identity lease(s) written meanwhile: %s", strings.Join(as, "; "))
	}
	return s + "; nothing more was sent, the writes in flight finished and are journaled: stop every kube-apiserver (on every node named) and any tool writing etcd directly, then run again (it picks up from what was written), or roll this run back"
}

// atRevision names a write of the run's time: who (a node, when a lease
// says), the key, and the revision.
func (w Write) atRevision() string {
	s := w.Key
	if w.Host != "" {
		s = w.Host + ": " + s
	}
	verb := "written"
	if w.Deleted {
		verb = "deleted"
	}
	if w.Writes > 1 {
		s += fmt.Sprintf(" %s %s, last at revision %d", verb, times(w.Writes), w.ModRevision)
	} else {
		s += fmt.Sprintf(" %s at revision %d", verb, w.ModRevision)
	}
	if w.Kind == IdentityLease {
		s += " (a kube-apiserver's identity lease)"
	} else if w.Kind == MasterLease {
		s += " (a kube-apiserver's master lease)"
	}
	return s
}
