package guard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/apiserverconfig"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
)

// Quota is etcd's --quota-backend-bytes as the tool found it.
type Quota struct {
	Bytes  int64  `json:"bytes"`  // what the run keeps below; DefaultQuotaBackendBytes when unknown
	Known  bool   `json:"known"`  // false: no source answered, Bytes is etcd's default
	Source string `json:"source"` // where Bytes comes from, for the preflight line
	// SQLite: no quota, but the room a SQLite datastore's file has to grow
	// in (SQLiteQuota).
	SQLite bool `json:"sqlite,omitempty"`
	// Server: no quota, and no room the tool can see: a database server's
	// (ServerQuota). Nothing is refused for room; the estimate is said.
	Server bool `json:"server,omitempty"`
}

// line is the preflight's line of the quota and the margin kept below it.
func (q Quota) line(margin int64) string {
	if q.Server {
		kind := "PostgreSQL"
		if strings.HasPrefix(q.Source, "the MySQL ") {
			kind = "MySQL"
		}
		return fmt.Sprintf("%s has no quota, and its room is on its server (%s), out of this host's sight", kind, q.Source)
	}
	if q.SQLite {
		return fmt.Sprintf("SQLite has no quota: the run keeps the database %s below the room of %s", textfmt.Bytes(margin), q.Source)
	}
	return fmt.Sprintf("etcd's quota: %s, from %s; the run keeps every member's database %s below it", textfmt.Bytes(q.Bytes), q.Source, textfmt.Bytes(margin))
}

// FindQuota finds etcd's real quota (spell names the operator's inputs in
// its Source; nil: words), in this order: every member's own
// etcd_server_quota_backend_bytes (its metrics on the client URL; the
// smallest when members differ, and the flag when that is smaller still); the
// flag (opts.QuotaBackendBytes, when the metrics do not answer); etcd's
// static-pod manifest beside kube-apiserver's (apiserverManifest,
// --apiserver-manifest, "" when none). When
// none answers the quota is unknown, said so with why, and etcd's default is
// assumed.
func FindQuota(ctx context.Context, cli *clientv3.Client, apiserverManifest string, flag int64, spell func(input.Name) string) Quota {
	if spell == nil {
		spell = input.Words
	}
	given := spell(input.QuotaBackendBytes)
	qs, merr := etcdscan.Quotas(ctx, cli)
	if merr == nil && len(qs) > 0 {
		q := qs[0]
		for _, o := range qs[1:] {
			if o.Bytes < q.Bytes {
				q = o
			}
		}
		src := fmt.Sprintf("%s of %s at %s", etcdscan.QuotaMetric, q.Member, q.URL)
		if len(qs) > 1 {
			src = fmt.Sprintf("%s of %d members (the smallest, %s)", etcdscan.QuotaMetric, len(qs), q.Member)
		}
		if flag > 0 && flag < q.Bytes {
			return Quota{Bytes: flag, Known: true, Source: fmt.Sprintf("%s (below the %s of %s)", given, textfmt.Bytes(q.Bytes), src)}
		}
		if flag > q.Bytes {
			src += fmt.Sprintf("; %s %s is larger, etcd enforces its own", given, textfmt.Bytes(flag))
		}
		return Quota{Bytes: q.Bytes, Known: true, Source: src}
	}
	why := []string{"metrics: " + WhyNoAnswer(merr)}
	if flag > 0 {
		return Quota{Bytes: flag, Known: true, Source: given + " (etcd's metrics did not answer: " + WhyNoAnswer(merr) + ")"}
	}
	if apiserverManifest != "" {
		eq, err := apiserverconfig.EtcdManifestQuota(apiserverManifest)
		switch {
		case err == nil && eq.Bytes > 0:
			return Quota{Bytes: eq.Bytes, Known: true, Source: "--quota-backend-bytes of etcd's manifest " + eq.File}
		case err == nil:
			return Quota{Bytes: DefaultQuotaBackendBytes, Known: true, Source: "etcd's default: its manifest " + eq.File + " sets no --quota-backend-bytes"}
		default:
			why = append(why, err.Error())
		}
	} else {
		why = append(why, "no "+spell(input.APIServerManifest)+" to find etcd's beside")
	}
	why = append(why, "no "+given)
	return Quota{Bytes: DefaultQuotaBackendBytes, Source: "unknown (" + strings.Join(why, "; ") + "): assuming etcd's default"}
}

// WhyNoAnswer is an etcd error on one line, or that no member answered (nil).
func WhyNoAnswer(err error) string {
	if err == nil {
		return "no member answered"
	}
	return textfmt.OneLine(err.Error())
}

// Margin is the room a run keeps below the quota: a twentieth of it, at least
// 1 MiB. It absorbs what the run cannot see at once (etcd commits its backend
// every 100 ms, a compaction itself takes pages) and leaves kube-apiserver
// room to start again.
func Margin(quota int64) int64 { return max(quota/20, 1<<20) }

// PutCost is what a put adds to etcd's backend: bbolt keeps each revision's
// key-value (the key, the value and some 64 bytes of revision key, header and
// fields) on 4 KiB pages that etcd fills to 90% with its sequential revision
// keys; one that does not fit twice into that takes whole pages of its own
// (measured: 1,000 puts of 2,000 bytes added 3.5 MiB).
func PutCost(key string, value []byte) int64 { return putCostN(len(key), len(value)) }

// putCostN is PutCost for a key and a value of these lengths.
func putCostN(keyLen, valueLen int) int64 {
	const page, fill, overhead = 4096, 4096 * 9 / 10, 64
	n := int64(keyLen + valueLen + overhead)
	if perPage := fill / n; perPage >= 2 {
		return page / perPage
	}
	return (n + page - 1) / page * page
}

// SpaceError is a run stopped before etcd's quota: the next writes would have
// taken the database past it. Nothing more was written and etcd raised no alarm.
type SpaceError struct {
	DBSize, Quota, Margin int64
	Compacted             bool   // the run compacted (--compact-history) and it was not enough
	Journal               string // the run's journal, "" without one
	Verb                  string // "rollback", or "" for migrate
}

func (e *SpaceError) Error() string { return e.Render(input.Words) }

// Render is the message with the inputs of its remedy spelled by spell.
func (e *SpaceError) Render(spell func(input.Name) string) string {
	what := "compact and defragment etcd ('etcdctl compact REV', 'etcdctl defrag'), then run again, or run again with " + spell(input.CompactHistory) + " to compact the history the run makes obsolete as it goes"
	switch {
	case e.Compacted && e.Verb == "rollback":
		what = "even after compacting (" + spell(input.CompactHistory) + ") the live data does not leave that room: defragment ('etcdctl defrag') or raise etcd's --quota-backend-bytes, then run the same rollback again"
	case e.Compacted:
		what = "even after compacting (" + spell(input.CompactHistory) + ") the live data does not leave that room: defragment ('etcdctl defrag'), migrate fewer " + spell(input.Resource) + " at a time, or raise etcd's --quota-backend-bytes"
	case e.Verb == "rollback":
		what = "run the same rollback again with " + spell(input.CompactHistory) + " to compact the history it makes obsolete as it goes, or compact and defragment etcd ('etcdctl compact REV', 'etcdctl defrag') first"
	}
	journal := ""
	if e.Journal != "" {
		journal = ", the journal " + e.Journal + " is intact"
	}
	return fmt.Sprintf("stopped before etcd's quota: the database is %s of %s and the next writes would leave less than the %s margin; nothing more was written and etcd raised no alarm%s; %s",
		textfmt.Bytes(e.DBSize), textfmt.Bytes(e.Quota), textfmt.Bytes(e.Margin), journal, what)
}

// SpaceReport says what a run saw of etcd's space.
type SpaceReport struct {
	Quota        Quota `json:"quota"`
	Margin       int64 `json:"margin"`
	DBSizeBefore int64 `json:"dbSizeBefore"`
	DBSizeAfter  int64 `json:"dbSizeAfter,omitempty"`
	DBSizeMax    int64 `json:"dbSizeMax"` // the largest seen during the run
	Compactions  int   `json:"compactions,omitempty"`
	// CompactedAt is the last revision the run compacted at (--compact-history).
	CompactedAt int64 `json:"compactedAt,omitempty"`
	// CompactSeconds is how long its compactions took, added up (each runs
	// in the background while the writes go on, from the moment it starts
	// waiting for the liveness watch to judge what it removes to etcd's
	// answer, or, for the run's last one when it goes on after the run
	// (LastGoesOn), to etcd having taken it); WaitSeconds how long the
	// guard held its writes (the batches wait for it one at a time: etcd's
	// sizes asked, a batch that did not fit waiting for etcd's commit or a
	// compaction to end, the run's last compaction waited for at its end):
	// where a compacting run's time goes.
	CompactSeconds float64 `json:"compactSeconds,omitempty"`
	WaitSeconds    float64 `json:"waitSeconds,omitempty"`
	// EndWaitSeconds is the part of WaitSeconds spent at the end, the
	// writes done, waiting for etcd to take the last compaction.
	EndWaitSeconds float64 `json:"endWaitSeconds,omitempty"`
	// LastGoesOn: etcd had taken the run's last compaction (its revisions
	// below CompactedAt can no longer be read) but was still removing them
	// from its database when the run ended; it finishes in etcd, as
	// kube-apiserver's compactions do, whatever becomes of the run.
	LastGoesOn bool `json:"lastCompactionGoesOn,omitempty"`
}

// StopError is a run ended at the first error no retry fixes (etcd out of
// space, permission denied): nothing more was written, the journal is closed
// and intact.
type StopError struct {
	Fatal   *etcdscan.FatalError
	Key     string // the first key refused
	Journal string // the journal of the run, "" without one
	Alarms  []string
	Verb    string // "migrate" or "rollback"
}

func (e *StopError) Error() string { return e.Render(input.Words) }

// Render is the message with the inputs of its remedy spelled by spell.
func (e *StopError) Render(spell func(input.Name) string) string {
	var b strings.Builder
	switch e.Fatal.Cause {
	case etcdscan.CauseNoSpace:
		alarm := "NOSPACE"
		if len(e.Alarms) > 0 {
			alarm = strings.Join(e.Alarms, ", ")
		}
		fmt.Fprintf(&b, "etcd is out of space (%s): it refused the write of %s and refuses every write of every client until the alarm is disarmed; stopped at once, nothing more was written", alarm, e.Key)
	case etcdscan.CauseUnavailable:
		fmt.Fprintf(&b, "etcd is unavailable: the write of %s got no answer: %v; stopped, nothing more was written (whether that last write landed is told by the key itself: a rollback or the next run checks it)", e.Key, e.Fatal.Err)
	default:
		fmt.Fprintf(&b, "etcd refused the write of %s: %v; stopped at once, nothing more was written", e.Key, e.Fatal.Err)
	}
	if e.Journal != "" {
		fmt.Fprintf(&b, ", the journal %s is intact", e.Journal)
	}
	switch {
	case e.Fatal.Cause == etcdscan.CauseUnavailable:
		fmt.Fprintf(&b, "; once etcd answers ('etcdctl endpoint health --cluster'), run the same %s again (it picks up from what was written); give every member's endpoint with %s so that a run goes on through the others when one member is lost", e.Verb, spell(input.Endpoints))
	case e.Fatal.Cause == etcdscan.CauseNoSpace && e.Verb == "rollback":
		b.WriteString("; rollback needs room too: make room ('etcdctl compact REV' at the current revision, 'etcdctl defrag' on every member, then 'etcdctl alarm disarm'; or raise etcd's --quota-backend-bytes), then run the same rollback again")
	case e.Fatal.Cause == etcdscan.CauseNoSpace:
		b.WriteString("; make room ('etcdctl compact REV' at the current revision, 'etcdctl defrag' on every member, then 'etcdctl alarm disarm'; or raise etcd's --quota-backend-bytes), then run again with " + spell(input.CompactHistory))
	default:
		fmt.Fprintf(&b, "; give credentials allowed to write the keys (%s/%s of kube-apiserver's etcd client, or %s with read-write on the prefix), then run again", spell(input.ClientCert), spell(input.ClientKey), spell(input.User))
	}
	return b.String()
}

// NewStopError turns the writer's stop into a StopError.
func NewStopError(ctx context.Context, fe *etcdscan.FatalError, key, journal, verb string, alarmsOf func(context.Context) ([]string, error)) *StopError {
	e := &StopError{Fatal: fe, Key: key, Journal: journal, Verb: verb}
	if fe.Cause == etcdscan.CauseNoSpace && alarmsOf != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), etcdscan.DefaultCommandTimeout)
		e.Alarms, _ = alarmsOf(actx)
		cancel()
	}
	return e
}

// FirstFatal is the key of the first result that failed for an error no
// retry fixes, and that error (nil when none).
func FirstFatal(results []etcdscan.PutResult) (string, *etcdscan.FatalError) {
	for _, r := range results {
		if r.Status != etcdscan.Failed {
			continue
		}
		var fe *etcdscan.FatalError
		if errors.As(r.Err, &fe) {
			return r.Key, fe
		}
	}
	return "", nil
}

// WriteCause names why a write failed, for a report's grouping.
func WriteCause(err error) string {
	if fe := etcdscan.AsFatal(err); fe != nil {
		return fe.Cause
	}
	var tooLarge *etcdscan.TooLargeError
	switch {
	case errors.Is(err, context.Canceled):
		return "interrupted"
	case errors.As(err, &tooLarge):
		return "too-large"
	}
	return "etcd-error"
}

// QuotaOf is the quota the run keeps below on the datastore api's
// kube-apiserver uses: FindQuota's for etcd; for a SQLite datastore served
// through kine (api.OnKine), which has none, what KineQuota says.
func QuotaOf(ctx context.Context, cli *clientv3.Client, api *apiserverconfig.Config, flag int64, spell func(input.Name) string) Quota {
	if api == nil {
		return FindQuota(ctx, cli, "", flag, spell)
	}
	if api.OnKine() {
		return KineQuota(api)
	}
	return FindQuota(ctx, cli, api.Manifest, flag, spell)
}

// KineQuota is what stands for etcd's quota on a datastore served through
// kine (api.OnKine): SQLiteQuota for a SQLite file, ServerQuota for a
// database server.
func KineQuota(api *apiserverconfig.Config) Quota {
	if api.KineDatabase != "" {
		return SQLiteQuota(api.KineDatabase)
	}
	return ServerQuota(api.KineServer)
}

// ServerQuota is what stands for etcd's quota on a datastore kept by a
// database server (k3s's PostgreSQL or MySQL, named by name): none, and its room is
// on the server, out of the tool's sight.
func ServerQuota(name string) Quota {
	return Quota{Bytes: DefaultQuotaBackendBytes, Server: true, Source: name}
}

// SQLiteQuota is what stands for etcd's quota on a SQLite datastore: the
// database file (with its write-ahead log) and the free space of its
// filesystem together, since SQLite grows the file until the filesystem is
// full. When the free space cannot be read, etcd's default is assumed, said
// so.
func SQLiteQuota(database string) Quota {
	var size int64
	for _, f := range []string{database, database + "-wal"} {
		if fi, err := os.Stat(f); err == nil {
			size += fi.Size()
		}
	}
	free, err := freeBytes(filepath.Dir(database))
	if err != nil {
		return Quota{Bytes: DefaultQuotaBackendBytes, Source: fmt.Sprintf("unknown (the free space beside the SQLite datastore %s: %v): assuming etcd's default", database, err)}
	}
	return Quota{Bytes: size + free, Known: true, SQLite: true, Source: fmt.Sprintf("%s: the datastore %s (%s) and the free space of its filesystem (%s)", textfmt.Bytes(size+free), database, textfmt.Bytes(size), textfmt.Bytes(free))}
}
