package guard

import (
	"context"
	"errors"
	"fmt"
	"kube-etcd-migrate/undo"
	"strings"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
)

// DefaultQuotaBackendBytes is etcd's default --quota-backend-bytes.
const DefaultQuotaBackendBytes = 2 << 30

// PreflightOptions are what the checks before a run's first write go by
// (migrate.Options carries them).
type PreflightOptions struct {
	Journal  string // --journal FILE, or the run directory's
	Snapshot string // --snapshot FILE, or the run directory's
	// SaveSnapshot, when set, saves Snapshot instead of etcd's own
	// snapshot (FirstWrite.Save: a SQLite datastore's copy).
	SaveSnapshot       func(ctx context.Context, path string) (undo.FileSum, error)
	AllowLiveAPIServer bool
	// QuotaBackendBytes is etcd's --quota-backend-bytes as the operator
	// gives it (0: not given). etcd's own metrics win when they answer and
	// are not smaller (FindQuota).
	QuotaBackendBytes int64
	// CompactHistory compacts etcd's history up to the run's latest write
	// whenever the database nears the quota (--compact-history).
	CompactHistory bool
	// LivenessWindow is how long the live-apiserver check watches etcd for
	// writes (--liveness-window); 0 = liveness.DefaultWindow.
	LivenessWindow time.Duration
	// Spell names the operator's inputs in the preflight's lines and the
	// quota's source (the command: its flags); nil: words.
	Spell func(input.Name) string
	// Sizes, when set, is what a dry run found just before (plan's): the
	// preflight's estimates of the rewrite and the journal take it instead
	// of a decision pass of their own.
	Sizes *WriteSizes
	// StateDir, when set, is where a rollback of the run will keep its own
	// undo (the run's state directory): the room for it is counted with the
	// run's own (RunSpace).
	StateDir undo.StateDir
	// SizesAsked, when set, is called each time a check needs the
	// rewrite's sizes: without Sizes, a decision pass adds them up (plan
	// counts that pass in its estimate of migrate).
	SizesAsked func()
	// OtherEtcd, when set, names the etcd the run writes to as another
	// etcd of the cluster than kube-apiserver's main one (its
	// --etcd-servers-overrides): its data directory on this host is not
	// known (the manifest or layout found is the main etcd's).
	OtherEtcd string
}

// spell is Spell, or words.
func (o PreflightOptions) spell() func(input.Name) string {
	if o.Spell != nil {
		return o.Spell
	}
	return input.Words
}

// PreflightError is a refusal before anything was written.
type PreflightError struct{ Err error }

func (e *PreflightError) Error() string {
	return "preflight: " + e.Err.Error() + " (nothing was written)"
}

func (e *PreflightError) Unwrap() error { return e.Err }

// Preflight runs the checks that must pass before the first write and returns a
// line per check passed, and the guard that keeps the run's writes below
// etcd's quota (from what the checks found of etcd's space). The liveness
// window is not among them: the run's Watch has it, and its first write
// waits for the verdict (FirstWrite).
func Preflight(ctx context.Context, env *pipeline.Env, opts PreflightOptions) ([]string, *SpaceGuard, error) {
	done, err := PreflightOffline(ctx, env, opts)
	if err != nil {
		return done, nil, err
	}

	sizes := newSizer(env, opts)
	lines, space, err := checkQuota(ctx, env, opts, sizes)
	done = append(done, lines...)
	if err != nil {
		return done, nil, err
	}
	var spoolRoom int64
	if opts.Journal != "" || opts.Snapshot != "" {
		lines, room, err := undoSpace(ctx, env, opts, space.status, space.quota.Bytes, sizes)
		done = append(done, lines...)
		if err != nil {
			return done, nil, err
		}
		spoolRoom = room
	}
	if err := CheckEncryption(ctx, env); err != nil {
		return done, nil, err
	}
	done = append(done, "write encryption providers encrypt and decrypt a probe value")
	guard := newSpaceGuard(etcdStatus{env.Client}, space.quota, opts.CompactHistory, space.status)
	guard.spoolRoom = spoolRoom
	return done, guard, nil
}

// CheckQuota says whether the rewrite fits below etcd's quota (or, with
// opts.CompactHistory, can be made to fit by compacting as it goes), with a
// line per finding; a refusal is a *PreflightError. Given a dry run's sizes
// (opts.Sizes), it also says whether a rollback of the run would fit after
// the rewrite (nil otherwise).
func CheckQuota(ctx context.Context, env *pipeline.Env, opts PreflightOptions) ([]string, *UndoFit, error) {
	lines, space, err := checkQuota(ctx, env, opts, newSizer(env, opts))
	if err != nil || opts.Sizes == nil || space.quota.Server {
		return lines, nil, err // no room known to fit a rollback in (a database server's)
	}
	fit := undoFit(space, *opts.Sizes)
	return lines, &fit, nil
}

// checkQuota is CheckQuota, also returning what it found of etcd's space.
func checkQuota(ctx context.Context, env *pipeline.Env, opts PreflightOptions, sizes *sizer) ([]string, *spaceStart, error) {
	st, err := etcdscan.Status(ctx, env.Client)
	if err != nil {
		return nil, nil, err
	}
	quota := QuotaOf(ctx, env.Client, env.Target.APIServer(), opts.QuotaBackendBytes, opts.Spell)
	// Every rewrite adds its new value to the database until compaction; all
	// live values together take at most DBSizeInUse.
	lines, err := fitQuota(st, quota, writeSize{
		what:  "rewrite",
		bound: st.DBSizeInUse,
		exact: func() (int64, error) { sz, err := sizes.get(ctx); return sz.EtcdBytes, err },
		fewer: true,
	}, opts.CompactHistory, opts.Spell)
	if err != nil {
		return lines, nil, err
	}
	return lines, &spaceStart{quota: quota, status: st}, nil
}

// UndoFit is whether a rollback of the run (its journal undone, as
// CheckRollbackQuota will count it) fits below etcd's quota less the margin
// after the rewrite.
type UndoFit struct {
	// RollbackBytes is what the rollback adds to etcd's backend.
	RollbackBytes int64 `json:"rollbackBytes"`
	// RoomAfter is the room below the quota less the margin once the rewrite
	// is written (the room now less what the rewrite adds: a lower bound,
	// compacting during the run only frees more); 0 when there is none.
	RoomAfter int64 `json:"roomAfterRewrite"`
	// NeedsCompaction: the rollback will fit only compacting etcd's history
	// as it goes (rollback's compaction, as migrate's).
	NeedsCompaction bool `json:"needsCompaction"`
}

// undoFit is whether a rollback fits below the quota less the margin once
// the rewrite sz describes is written.
func undoFit(space *spaceStart, sz WriteSizes) UndoFit {
	st, quota := space.status, space.quota
	room := quota.Bytes - Margin(quota.Bytes) - st.DBSize + st.Free - sz.EtcdBytes
	return UndoFit{RollbackBytes: sz.RollbackBytes, RoomAfter: max(room, 0), NeedsCompaction: sz.RollbackBytes > room}
}

// writeSize is what a writing run (migrate, rollback) is about to add to
// etcd's database, for fitQuota.
type writeSize struct {
	what  string                // "rewrite", "rollback"
	bound int64                 // what the writes take at most
	exact func() (int64, error) // about what they take: asked only when bound does not fit
	fewer bool                  // migrating fewer resources at a time is a remedy
	// replaced, when not nil, is at most how much of the pages in use hold
	// history the runs being undone left (the values they replaced, which
	// compaction frees): asked only when the pages in use leave no room.
	replaced func() (int64, error)
}

// fitQuota says whether the run's writes fit below etcd's quota less the
// margin (reusing the pages free in the database first), or, with compact,
// can be made to fit by compacting as it goes, with a line per finding; a
// refusal is a *PreflightError.
func fitQuota(st etcdscan.StatusInfo, quota Quota, w writeSize, compact bool, spell func(input.Name) string) ([]string, error) {
	if spell == nil {
		spell = input.Words
	}
	compaction := spell(input.CompactHistory)
	margin := Margin(quota.Bytes)
	done := []string{quota.line(margin)}
	if quota.Server {
		// No room to check it against: the estimate is said, for the
		// operator to check on the server.
		return append(done, fmt.Sprintf("database %s + %s at most %s: kine adds a row per value written until it compacts; make sure the server has that room", textfmt.Bytes(st.DBSize), w.what, textfmt.Bytes(w.bound))), nil
	}
	room := quota.Bytes - margin - st.DBSize + st.Free
	estimate, how := w.bound, "at most"
	// With compaction the run goes ahead whatever the writes take (the
	// live data decides, below): no pass over the keys to add them up.
	if estimate > room && !compact {
		var err error
		if estimate, err = w.exact(); err != nil {
			return done, err
		}
		how = "about"
	}
	switch {
	case estimate <= room:
		line := fmt.Sprintf("database %s + %s %s %s fits below the quota", textfmt.Bytes(st.DBSize), w.what, how, textfmt.Bytes(estimate))
		if compact {
			line += "; " + compaction + " compacts etcd's history when it nears the quota all the same"
		} else {
			line += "; compact and defragment afterwards to reclaim it"
		}
		done = append(done, line)
	case !compact:
		format, args := "the %s would add about %s to a %s database, past etcd's %s quota less the %s margin (quota from %s); rerun with %s to compact the history the run makes obsolete as it goes (as kube-apiserver does), or compact and defragment etcd first ('etcdctl compact', 'etcdctl defrag')",
			[]any{w.what, textfmt.Bytes(estimate), textfmt.Bytes(st.DBSize), textfmt.Bytes(quota.Bytes), textfmt.Bytes(margin), quota.Source, input.CompactHistory}
		if w.fewer {
			format, args = format+", or migrate fewer resources at a time (%s)", append(args, input.Resource)
		}
		return done, &PreflightError{Err: input.Errorf(format, args...)}
	default:
		// Compacting frees the pages of every revision the live values do
		// not need: what is left is the live data and the margin. The pages
		// in use are more than the live data: they hold the history not
		// compacted yet too, and the pages a compaction freed, which etcd
		// counts free only after its next commits with writes in them.
		least := minCompactRoom(quota.Bytes)
		free, replaced := quota.Bytes-margin-st.DBSizeInUse, int64(0)
		if free < least && w.replaced != nil {
			var err error
			if replaced, err = w.replaced(); err != nil {
				return done, err
			}
		}
		if free+replaced < least {
			live := textfmt.Bytes(st.DBSizeInUse) + " in use"
			if replaced > 0 {
				live = fmt.Sprintf("%s in use, of which the %s the %s puts back may be history that compaction frees (%s would still be live)",
					textfmt.Bytes(st.DBSizeInUse), textfmt.Bytes(replaced), w.what, textfmt.Bytes(max(st.DBSizeInUse-replaced, 0)))
			}
			return done, &PreflightError{Err: input.Errorf("even with %s there is no room: %s in a %s quota less the %s margin; compact etcd's history and defragment it ('etcdctl compact', then 'etcdctl defrag' on every member: only then does etcd count what compaction frees), or raise its --quota-backend-bytes",
				input.CompactHistory, live, textfmt.Bytes(quota.Bytes), textfmt.Bytes(margin))}
		}
		done = append(done, fmt.Sprintf("database %s + %s %s %s is more than the %s left below the quota: %s compacts etcd's history up to the run's latest write whenever the database nears the quota",
			textfmt.Bytes(st.DBSize), w.what, how, textfmt.Bytes(estimate), textfmt.Bytes(max(room, 0)), compaction))
	}
	if compact {
		done = append(done, compaction+": the old revisions of what the run writes are compacted away as it goes, as kube-apiserver's compactor does every 5 minutes; the journal, not etcd's history, is the rollback")
	}
	return done, nil
}

// CheckEncryption has the write encryption provider of every resource in
// scope encrypt and decrypt a probe value (a KMS plugin that does not answer
// fails it); a refusal is a *PreflightError.
func CheckEncryption(ctx context.Context, env *pipeline.Env) error {
	grs := env.Storage.BuiltinResources()
	for _, crd := range env.CRDs {
		grs = append(grs, crd.Resource)
	}
	if env.Filter != nil {
		grs = grs[:0]
		for gr := range env.Filter {
			grs = append(grs, gr)
		}
	}
	if err := env.Encryption.Preflight(ctx, grs); err != nil {
		return &PreflightError{Err: fmt.Errorf("write encryption provider: %w", err)}
	}
	return nil
}

// CheckUndoSpace says whether the snapshot and journal of opts fit on their
// filesystems, with etcd's growth and a rollback's own undo (undoSpace), a
// line per filesystem; a refusal is a *PreflightError.
func CheckUndoSpace(ctx context.Context, env *pipeline.Env, opts PreflightOptions) ([]string, error) {
	st, err := etcdscan.Status(ctx, env.Client)
	if err != nil {
		return nil, err
	}
	quota := QuotaOf(ctx, env.Client, env.Target.APIServer(), opts.QuotaBackendBytes, opts.Spell)
	lines, _, err := undoSpace(ctx, env, opts, st, quota.Bytes, newSizer(env, opts))
	return lines, err
}

// undoSpace checks, before the first write, that the run's snapshot and
// journal fit on their filesystems, with etcd's own growth on the
// filesystem of its data directory (found through etcd's manifest: FindEtcdData)
// and, given opts.StateDir, a rollback's own undo and etcd's growth from it
// (RunSpace). The snapshot is the leader's database file; the journal holds
// every rewritten key's old value in base64 with its key and hashes: at
// most about twice the live data; what the run writes to etcd is at most
// the live data. When that does not fit, a decision pass adds up what the
// stale objects take. room is what is left beside all that on the
// journal's filesystem (SpaceGuard.SpoolRoom).
func undoSpace(ctx context.Context, env *pipeline.Env, opts PreflightOptions, st etcdscan.StatusInfo, quota int64, sizes *sizer) (lines []string, room int64, err error) {
	etcd := FindEtcdData(env.Target.APIServer().Manifest, EtcdDataOf(env.Target.APIServer()))
	if opts.OtherEtcd != "" {
		etcd = EtcdData{Source: fmt.Sprintf("unknown: the etcd of %s (--etcd-servers-overrides) is not the one whose manifest or layout is known", opts.OtherEtcd)}
	}
	space := RunSpace{
		Snapshot: opts.Snapshot, Journal: opts.Journal, JournalBytes: 2 * st.DBSizeInUse,
		Writes:   st.DBSizeInUse,
		StateDir: opts.StateDir, RollbackWrites: st.DBSizeInUse, RollbackJournalBytes: 2 * st.DBSizeInUse,
		Etcd: etcd, Status: st, Quota: quota,
	}
	lines, err = CheckDiskSpace(space.Needs())
	var se *DiskSpaceError
	if errors.As(err, &se) {
		exact, serr := sizes.get(ctx)
		if serr != nil {
			return lines, 0, serr
		}
		space.JournalBytes, space.Writes = exact.JournalBytes, exact.EtcdBytes
		space.RollbackWrites, space.RollbackJournalBytes = exact.RollbackBytes, exact.JournalBytes
		lines, err = CheckDiskSpace(space.Needs())
	}
	if etcd.Dir == "" {
		lines = append(lines, "etcd's data directory on this host: "+etcd.Source+"; its growth is not counted")
	}
	if err == nil && opts.Journal != "" {
		room = roomBeside(opts.Journal, space.Needs(), freeBytes)
	}
	return lines, room, wrapSpace(err)
}

func wrapSpace(err error) error {
	var se *DiskSpaceError
	if errors.As(err, &se) {
		return &PreflightError{Err: se}
	}
	return err
}

// WriteSizes is what rewriting the stale objects takes: their new values in
// etcd's backend (putCost) and their journal records (JournalRecordBytes).
type WriteSizes struct {
	EtcdBytes    int64 `json:"etcdBytes"`
	JournalBytes int64 `json:"journalBytes"`
	// RollbackBytes is what undoing the rewrite adds to etcd's backend:
	// every old value put back (rollback's own count of its journal).
	RollbackBytes int64 `json:"rollbackBytes"`
}

// Add counts the rewrite of one stale object.
func (w *WriteSizes) Add(d reencode.Decision) {
	w.EtcdBytes += PutCost(d.Key, d.NewValue)
	w.JournalBytes += undo.JournalRecordBytes(d.Key, d.OldSize)
	w.RollbackBytes += putCostN(len(d.Key), d.OldSize)
}

// sizer is a preflight's WriteSizes: given (a dry run's, opts.Sizes), or
// added up by one decision pass over the selected keys the first time a
// check needs them, shared by the quota's check and the journal's.
type sizer struct {
	env   *pipeline.Env
	known *WriteSizes
	asked func()
}

func newSizer(env *pipeline.Env, opts PreflightOptions) *sizer {
	return &sizer{env: env, known: opts.Sizes, asked: opts.SizesAsked}
}

func (s *sizer) get(ctx context.Context) (WriteSizes, error) {
	if s.asked != nil {
		s.asked()
	}
	if s.known != nil {
		return *s.known, nil
	}
	w, err := MeasureRewrite(ctx, s.env)
	if err != nil {
		return w, err
	}
	s.known = &w
	return w, nil
}

// MeasureRewrite adds up, by one decision pass over the keys env selects,
// what rewriting the stale ones takes: the preflight's estimate when no dry
// run gave it.
func MeasureRewrite(ctx context.Context, env *pipeline.Env) (WriteSizes, error) {
	var w WriteSizes
	_, err := env.Run(ctx, 0, pipeline.Decide, func(page []reencode.Decision) error {
		for _, d := range page {
			if d.Status == reencode.Stale {
				w.Add(d)
			}
		}
		return nil
	})
	if err != nil {
		return w, fmt.Errorf("preflight: estimate the rewrite: %w", err)
	}
	return w, nil
}

// spaceStart is what the preflight found of etcd's space.
type spaceStart struct {
	quota  Quota
	status etcdscan.StatusInfo
}

// minCompactRoom is the least room below the quota a compacting run needs to
// make progress between two compactions.
func minCompactRoom(quota int64) int64 { return 2 * max(Margin(quota)/4, 256<<10) }

// PreflightOffline runs the checks any write needs (migrate's, quarantine's)
// that etcd answers at once: etcd has no alarm. Whether a kube-apiserver is
// alive is the run's Watch's (StartWatch): its window runs while the run
// goes on, and the first write waits for it.
func PreflightOffline(ctx context.Context, env *pipeline.Env, opts PreflightOptions) ([]string, error) {
	var done []string
	alarms, err := etcdscan.Alarms(ctx, env.Client)
	if err != nil {
		return done, err
	}
	if len(alarms) > 0 {
		return done, &PreflightError{Err: fmt.Errorf("etcd has active alarms: %s; resolve them (for NOSPACE: compact, defragment, then 'etcdctl alarm disarm')", strings.Join(alarms, "; "))}
	}
	done = append(done, "etcd has no active alarm")
	return done, nil
}
