// Package liveness tells whether a kube-apiserver, or anything else, is
// writing a cluster's keys in etcd, from what etcd itself shows changing. It
// watches the cluster's key prefix from etcd's current revision for a window
// and reports every key written meanwhile, with its mod revisions; it never
// judges by a time a node's clock wrote (a lease's renewTime), so a skew of
// minutes neither hides a live kube-apiserver nor accuses a stopped one. A
// kube-apiserver rewrites its identity lease every 10 s, so a window longer
// than that sees every live one; master leases, whose etcd lease TTL etcd
// keeps on the server, count while their lease has time left.
//
// A run that writes keeps the same watch (Watch) from before its first write
// to after its last, and tells its own writes from others' by etcd's
// revisions, never by a clock: each of its requests is announced before it is
// sent (Begin) and its outcome given once known (Applied with the revision
// etcd answered, NotApplied, or Unknown when it failed in a way that may have
// been applied). Etcd may show a write before the request's answer arrives,
// so an event is judged only once every request announced before it came has
// its outcome: it is the run's when its revision is one of the run's (a
// transaction's writes all share its revision, and no other request has it),
// or, for a request whose outcome is unknown, when it writes one of that
// request's keys with exactly its value (a delete: deletes one of its keys).
// A request announced after the event came cannot have made it. Anything
// else under the prefix stops the run (WriterError), but for etcd deleting a
// key whose lease ran out (an expiry: the key had an etcd lease just before
// its delete). A compaction is not a write; the run's own compactions wait
// until the watch has judged every revision they remove (WaitJudged), and
// one by another, which removes history the watch has not seen yet, ends the
// watch with an error (what was written in that history cannot be known).
// Once the window's verdict is in, etcd's watch is closed while every
// revision is the run's: the revisions etcd answers the run's requests with
// account for them, so etcd does not send back every value the run writes.
// A revision that is not the run's (seen between two of its own, or read
// from etcd every quarter second while the run does not write) is a gap; once
// the requests announced before it was noticed have their outcomes (one of
// them may still be answered with it; a later one cannot), the watch opens
// from it, without previous values (a delete reads whether its key had a
// lease when it must), the run's next request waits until it is judged, and
// it judges what it shows as above (another writer, one
// of the run's writes whose outcome is unknown, etcd expiring a lease, or a
// write outside the prefix, which is nothing to the run), and closes again
// a second after it has caught up. Settle, after the last write, waits until
// every revision up to etcd's current one is judged.
package liveness

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// DefaultWindow is how long Observe watches by default: longer than
// kube-apiserver's 10 s identity-lease renew interval
// (IdentityLeaseRenewIntervalPeriod), with room for a slow renewal.
const DefaultWindow = 15 * time.Second

// RenewInterval is how often a live kube-apiserver rewrites its identity lease.
const RenewInterval = 10 * time.Second

// catchUp bounds the wait, after the window, for etcd's watch to report every
// revision up to the window's end.
const catchUp = 10 * time.Second

// Kind says what a written key tells about who writes.
type Kind string

const (
	// IdentityLease is a kube-apiserver's identity lease under
	// leases/kube-system/ (label apiserver.kubernetes.io/identity=kube-apiserver,
	// or named kube-apiserver-* or apiserver-*).
	IdentityLease Kind = "identity-lease"
	// MasterLease is a key under masterleases/ (the endpoint reconciler's).
	MasterLease Kind = "master-lease"
	// Other is any other key: only a kube-apiserver, or a tool writing etcd
	// directly, writes under the prefix.
	Other Kind = "other"
)

// Write is a key etcd shows written during the window.
type Write struct {
	Key  string `json:"key"`
	Kind Kind   `json:"kind"`
	// Host is an identity lease's kubernetes.io/hostname label ("" when none).
	Host string `json:"host,omitempty"`
	// RenewTime is what an identity lease's spec.renewTime says, from its
	// writer's clock: shown, never used to decide.
	RenewTime *time.Time `json:"renewTime,omitempty"`
	// PrevModRevision is the key's mod revision before the window (0 when it
	// was created during it); ModRevision the last one seen.
	PrevModRevision int64 `json:"prevModRevision"`
	ModRevision     int64 `json:"modRevision"`
	Writes          int   `json:"writes"`
	// Deleted: the last write was a delete of a key without an etcd lease
	// (a client's delete, not an expiry).
	Deleted bool `json:"deleted,omitempty"`
}

func (w Write) String() string {
	s := w.Key
	if w.Host != "" {
		s = w.Host + ": " + s
	}
	verb := "written"
	if w.Deleted {
		verb = "deleted"
	}
	if w.PrevModRevision == 0 {
		s += fmt.Sprintf(" %s %s, mod revision %d (created meanwhile)", verb, times(w.Writes), w.ModRevision)
	} else {
		s += fmt.Sprintf(" %s %s, mod revision %d -> %d", verb, times(w.Writes), w.PrevModRevision, w.ModRevision)
	}
	if w.RenewTime != nil {
		s += ", renewTime " + w.RenewTime.UTC().Format(time.RFC3339) + " (its node's clock, not used)"
	}
	return s
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

// HeldMasterLease is a master lease whose etcd lease had time left at the
// window's end.
type HeldMasterLease struct {
	Key        string `json:"key"`
	TTL        int64  `json:"ttl"`        // seconds left, as etcd counts them
	GrantedTTL int64  `json:"grantedTTL"` // seconds granted
}

// Report is what Observe saw.
type Report struct {
	Prefix string        `json:"prefix"`
	Window time.Duration `json:"window"`
	// FromRevision is etcd's revision when the watch began; ToRevision its
	// revision when the window ended.
	FromRevision int64 `json:"fromRevision"`
	ToRevision   int64 `json:"toRevision"`
	// Written are the keys put (or deleted without an etcd lease) during the
	// window: kube-apiserver leases first, then the others by key.
	Written []Write `json:"written,omitempty"`
	// MasterLeases are master leases whose etcd lease had time left at the end.
	MasterLeases []HeldMasterLease `json:"masterLeases,omitempty"`
	// Expired counts keys with an etcd lease deleted during the window: etcd
	// expiring an Event's lease, or a stopped kube-apiserver's master lease.
	Expired int `json:"expired,omitempty"`
}

// APIServers are the kube-apiserver leases written during the window.
func (r *Report) APIServers() []Write {
	var out []Write
	for _, w := range r.Written {
		if w.Kind != Other {
			out = append(out, w)
		}
	}
	return out
}

// Others are the other keys written during the window.
func (r *Report) Others() []Write {
	var out []Write
	for _, w := range r.Written {
		if w.Kind == Other {
			out = append(out, w)
		}
	}
	return out
}

// Live reports whether the write should be refused: a key was written under
// the prefix during the window, or a master lease still has time left.
func (r *Report) Live() bool { return len(r.Written) > 0 || len(r.MasterLeases) > 0 }

// maxListed caps the keys a line names of each sort.
const maxListed = 5

func list(ws []Write) string {
	var s []string
	for i, w := range ws {
		if i == maxListed {
			s = append(s, fmt.Sprintf("and %d more", len(ws)-maxListed))
			break
		}
		s = append(s, w.String())
	}
	return strings.Join(s, "; ")
}

func (r *Report) watched() string {
	return fmt.Sprintf("while watched for %s (etcd revisions %d to %d)", r.Window, r.FromRevision, r.ToRevision)
}

// Refusal is a one-line reason to refuse the write, naming every key that
// moved, or "" when the report shows nothing alive. It names no flag: the
// caller adds how to override.
func (r *Report) Refusal() string {
	api, others := r.APIServers(), r.Others()
	switch {
	case len(api) > 0:
		s := fmt.Sprintf("a kube-apiserver is alive: etcd shows %d kube-apiserver lease(s) written %s: %s", len(api), r.watched(), list(api))
		if len(others) > 0 {
			s += fmt.Sprintf("; also written: %d other key(s): %s", len(others), list(others))
		}
		return s + "; stop every kube-apiserver first (on every node named)"
	case len(others) > 0:
		return fmt.Sprintf("something is writing under %s: etcd shows %d key(s) written %s: %s; only a kube-apiserver, or a tool writing etcd directly, writes there (kube-controller-manager, kube-scheduler and kubelets write through a kube-apiserver), and a write under the rewrite races it: stop every kube-apiserver and any such tool first",
			r.Prefix, len(others), r.watched(), list(others))
	case len(r.MasterLeases) > 0:
		var s []string
		for _, m := range r.MasterLeases {
			s = append(s, fmt.Sprintf("%s has %ds of its %ds left", m.Key, m.TTL, m.GrantedTTL))
		}
		return fmt.Sprintf("a master lease's etcd lease has not expired, though no key was written %s: %s; a kube-apiserver keeps it while it runs and one stopped lately leaves it until it expires (etcd restarts the countdown when a member restarts or its leader changes): wait that long and rerun",
			r.watched(), strings.Join(s, "; "))
	}
	return ""
}

// Summary is the line saying what the window showed when nothing is alive.
func (r *Report) Summary() string {
	s := fmt.Sprintf("no key under %s written %s: no kube-apiserver is alive", r.Prefix, r.watched())
	if r.Expired > 0 {
		s += fmt.Sprintf("; %d key(s) expired with their etcd lease meanwhile (Events, master leases of stopped kube-apiservers)", r.Expired)
	}
	if r.Window < RenewInterval {
		s += fmt.Sprintf("; a window shorter than kube-apiserver's %s identity-lease renewal can miss a live one", RenewInterval)
	}
	return s
}

var leaseDecoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	utilruntime.Must(coordinationv1.AddToScheme(s))
	return serializer.NewCodecFactory(s).UniversalDeserializer()
}()

// Observe watches every key under prefix (kube-apiserver's --etcd-prefix) from
// etcd's current revision for window (DefaultWindow when 0 or less), then
// waits until etcd's watch has reported every revision up to the window's
// end, then reads which master leases still have time left. It writes
// nothing. A compaction during the window is an error: what was written
// meanwhile cannot be known. (A run that writes keeps the watch: Start.)
func Observe(ctx context.Context, cli *clientv3.Client, prefix string, window time.Duration) (*Report, error) {
	w, err := Start(ctx, cli, prefix, window)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	return w.Window(ctx)
}

// record adds one watch event of the window (with its previous value) to
// what the window saw.
func record(expired *int, byKey map[string]*Write, prefix string, ev *clientv3.Event) {
	key := string(ev.Kv.Key)
	deleted := ev.Type == clientv3.EventTypeDelete
	if deleted && ev.PrevKv != nil && ev.PrevKv.Lease != 0 {
		// Deleted with its etcd lease: etcd expiring it (a stopped writer's
		// key), or a client's delete, which a live kube-apiserver's lease
		// renewals show anyway.
		*expired++
		return
	}
	w := byKey[key]
	if w == nil {
		w = &Write{Key: key, Kind: kindOf(prefix, key)}
		if ev.PrevKv != nil {
			w.PrevModRevision = ev.PrevKv.ModRevision
		}
		byKey[key] = w
	}
	w.Writes++
	w.ModRevision = ev.Kv.ModRevision
	w.Deleted = deleted
	if !deleted {
		describe(prefix, ev.Kv.Value, w)
	}
}

// kindOf judges a key by its name.
func kindOf(prefix, key string) Kind {
	switch rest := strings.TrimPrefix(key, prefix+"/"); {
	case strings.HasPrefix(rest, "masterleases/"):
		return MasterLease
	case strings.HasPrefix(rest, "leases/kube-system/kube-apiserver-"), strings.HasPrefix(rest, "leases/kube-system/apiserver-"):
		return IdentityLease
	}
	return Other
}
