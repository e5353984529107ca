package plan

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/batches"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/liveness"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// Estimate is how long migrate, run with the plan's flags, would keep the
// API down on this machine: a range (Low–High seconds) and what it is made
// of (Parts). It is built from what plan timed here — its own setup and
// checks, the decision over every object (decode, re-encode, encrypt: the
// KMS plugins' round trips included), a sample of the stale objects through
// the journal's code, a sample of etcd's snapshot stream, the hashing of
// the run's end — and from what etcd reports of its own costs (each
// member's metrics: the time an apply of a write takes it, its WAL fsyncs,
// its backend's commits, its compactions, its database's size). On a SQLite
// datastore, which has no etcd, the writes are timed instead: a sample of
// migrate's writes to plan's private copy of the datastore (WriteSample),
// and the snapshot is as long as that copy took. It writes nothing of the
// cluster's.
type Estimate struct {
	// DecideSeconds is how long the decision over every object took here.
	DecideSeconds float64 `json:"decideSeconds"`
	// LivenessSeconds is migrate's liveness window (0 with
	// --allow-live-apiserver); SnapshotSeconds and WriteSeconds are the
	// middles of the snapshot's and the writes' parts; Seconds the middle
	// of the range.
	LivenessSeconds float64 `json:"livenessSeconds"`
	SnapshotSeconds float64 `json:"snapshotSeconds"`
	WriteSeconds    float64 `json:"writeSeconds"`
	Seconds         float64 `json:"seconds"`
	// Low and High bound the whole run, process start to exit.
	Low  float64 `json:"low"`
	High float64 `json:"high"`
	// Compactions is how many compactions of etcd's history the run would
	// make (--compact-history), as its space guard makes them: the least
	// and the most.
	Compactions [2]int `json:"compactions"`
	// Parts: setup, snapshot, decisions, writes, compactions, end; the run
	// takes setup + max(window, snapshot) + the longer of the decisions and
	// the writes (or both) + the compactions' waits + end.
	Parts []EstimatePart `json:"parts"`
	// Etcd is what etcd reported that the estimate uses (nil when no
	// member's metrics answered: the estimate then assumes the project's
	// benchmark machine).
	Etcd *EtcdCosts `json:"etcd,omitempty"`
	// Writes is what plan timed of migrate's writes on a SQLite datastore,
	// written to its private copy of it (nil elsewhere: etcd's costs are
	// its metrics'; PostgreSQL's are assumed, plan writing nothing there).
	Writes *WriteSample `json:"writeSample,omitempty"`
	Basis  string       `json:"basis"`
}

// EstimatePart is one part of the estimate, in seconds.
type EstimatePart struct {
	Name  string  `json:"name"`
	Low   float64 `json:"low"`
	High  float64 `json:"high"`
	Basis string  `json:"basis"`
}

// EtcdCosts are etcd's own costs as its members report them (the slowest
// member's: every member applies every write), since each started.
type EtcdCosts struct {
	// Metrics is where they were read (the slowest member's).
	Metrics string `json:"metrics"`
	// ApplyPerWrite is the time an apply took per put or delete (seconds).
	ApplyPerWrite float64 `json:"applyPerWriteSeconds"`
	WALFsync      float64 `json:"walFsyncSeconds"` // mean
	// WALFsyncMedian is the upper bound of the bucket of etcd's histogram
	// that holds the median fsync: a member that also made large fsyncs
	// (big transactions) has a mean well above what a batch of 16 costs.
	WALFsyncMedian float64 `json:"walFsyncMedianSeconds"`
	BackendCommit  float64 `json:"backendCommitSeconds"` // mean
	// Compaction is the mean time of its compactions (0: none seen), and
	// CompactionPause of their batches' holds on its backend; Keys the keys
	// in its index now.
	Compaction      float64 `json:"compactionSeconds"`
	CompactionPause float64 `json:"compactionPauseSeconds"`
	Keys            int64   `json:"keys"`
	Error           string  `json:"error,omitempty"` // why some member's metrics did not answer
}

// costs are what plan measured and read, the estimate's inputs (seconds,
// bytes, per rewrite where named so).
type costs struct {
	cores int
	// kine: the datastore is served through kine, its window the file's
	// holders (SQLite) or the database's clients (PostgreSQL) looked at once.
	kine bool
	// server: the datastore is a database server's (PostgreSQL through
	// kine): no snapshot, its window the clients connected to it.
	server bool
	// serverKind is the database server's: "PostgreSQL", "MySQL".
	serverKind string
	// setup is this process's time from its start to the plan's first
	// check; checks the preflight's checks of migrate as plan ran them.
	setup, checks float64
	// sizingPass: migrate's own preflight would add up the rewrite's sizes
	// with a decision pass of its own (no dry run hands them to it).
	sizingPass bool
	// The decision over every object: wall time, this process's CPU time.
	decideWall, decideCPU float64
	scanned, stale        int64
	sizes                 guard.WriteSizes
	window                float64 // 0 without a liveness watch
	journal, snapshot     bool    // what the run keeps
	compact               bool
	// etcd's space at the plan.
	dbSize, free, quota int64
	// The samples: the journal's CPU per rewrite (writing, and reading it
	// back at the run's end), etcd's snapshot stream (bytes/s; 0: not
	// sampled), sha256 (bytes/s).
	journalWrite, journalRead float64
	snapshotRate, hashRate    float64
	etcd                      *EtcdCosts
	// On a SQLite datastore, plan's private copy of it: how long the copy
	// took (SQLite's VACUUM INTO, as the undo's snapshot is taken; 0: not
	// known), and the writes timed on it (nil: none).
	copied float64
	writes *WriteSample
}

// sqliteTimed says whether the writes were timed on plan's copy of a
// SQLite datastore (and the sample went through).
func (c costs) sqliteTimed() bool {
	return c.kine && !c.server && c.writes != nil && c.writes.Error == "" && c.writes.Writes > 0
}

// The estimate's constants: what plan cannot time without writing, each
// measured by the project's benchmark (docs/benchmarks.md, "plan's
// estimate"), on 2 cores shared by the tool and etcd.
const (
	// batchPuts is how many rewrites a transaction carries (etcdscan.DefaultMaxOps).
	batchPuts = 16
	// writersInFlight is how many batches migrate keeps in flight
	// (batches.DefaultWriters): the journal's fsync of one covers the
	// others' waiting beside it.
	writersInFlight = batches.DefaultWriters
	// clientCPU is the tool's CPU per rewrite for its etcd client (the
	// transaction's request and answer, gRPC), beside the decision and the
	// journal; watchCPU the liveness watch's per rewrite (each write comes
	// back to it as an event).
	clientCPU = 20e-6
	watchCPU  = 6e-6
	// etcdCPUPerApply is etcd's CPU per write, in applies of a write as
	// etcd times them (gRPC, raft, the WAL's encoding beside the apply);
	// etcdWatchPerApply what sending each write to the run's watch adds.
	etcdCPUPerApply   = 1.7
	etcdWatchPerApply = 0.9
	// defaultApply is the apply time per write assumed when no member's
	// metrics answered (the benchmark machine's).
	defaultApply = 30e-6
	// defaultFsync is the WAL fsync assumed then.
	defaultFsync = 1e-3
	// busyLow and busyHigh are how much of the machine's cores the run's
	// writes keep busy, the tool's and etcd's together: at best all, at
	// worst about half of it (measured 0.6–0.95).
	busyLow, busyHigh = 1.0, 0.55
	// compactionBatch, compactionSleep: etcd's defaults, a compaction's
	// walk of the revisions (--compaction-batch-limit, --compaction-sleep-interval).
	compactionBatch = 1000
	compactionSleep = 0.010
	// defaultPause is a compaction batch's hold when none was seen.
	defaultPause = 0.003
	// snapshotStretch is how much longer saving a snapshot takes than
	// etcd's stream of it (the file written and synced) at worst.
	snapshotStretch = 1.6
)

// estimate builds the Estimate from the costs.
func estimate(c costs) Estimate {
	e := Estimate{DecideSeconds: c.decideWall, LivenessSeconds: c.window, Etcd: c.etcd, Writes: c.writes}
	cores := float64(max(c.cores, 1))
	apply, fsync := defaultApply, defaultFsync
	if c.etcd != nil && c.etcd.ApplyPerWrite > 0 {
		apply = c.etcd.ApplyPerWrite
	}
	if c.etcd != nil && c.etcd.WALFsync > 0 {
		fsync = c.etcd.WALFsync
	}
	s := float64(c.stale)
	batches := math.Ceil(s / batchPuts)

	// Setup: this process's own, to the checks; then migrate's checks (and
	// its own decision pass when it would make one).
	checks := c.checks
	checksBasis := fmt.Sprintf("the preflight's checks, %.1fs here", c.checks)
	if c.sizingPass {
		checks += c.decideWall
		checksBasis += fmt.Sprintf(", and a decision pass of its own to add up the rewrite (%.1fs here): etcd's room does not hold the live data's size", c.decideWall)
	}
	// migrate's own setup adds its run directory, the cluster's lock and
	// the liveness watch, and its exit (measured 0.5–0.65 s in all on 2
	// loaded cores).
	setup := EstimatePart{Name: "setup", Low: c.setup, High: 2*c.setup + 0.5,
		Basis: fmt.Sprintf("the process's start: the runtime, etcd, the target and the custom resources, as plan's own took %.1fs, then migrate's run directory, lock and watch, and its exit", c.setup)}

	// The first write: after the window, and after the checks and the snapshot.
	snap := EstimatePart{Name: "snapshot", Basis: "no undo (--no-undo): no snapshot"}
	if c.server && c.journal {
		snap.Basis = fmt.Sprintf("no snapshot (%s: the journal is the undo, the dump taken first the way back beyond it)", c.serverKind)
	}
	switch {
	case c.snapshot && c.kine && !c.server && c.copied > 0:
		// SQLite: the snapshot is VACUUM INTO of the datastore, which plan
		// made of it for its own copy.
		snap.Low, snap.High = c.copied, snapshotStretch*c.copied+0.2
		snap.Basis = fmt.Sprintf("the undo's snapshot, SQLite's VACUUM INTO of the datastore: plan's own copy of it took %.1fs here", c.copied)
	case c.snapshot:
		rate, how := c.snapshotRate, "etcd streamed a sample of it here at %s/s"
		if rate <= 0 {
			rate, how = 100<<20, "%s/s assumed (etcd's own assumption for a snapshot's transfer; no sample)"
		}
		t := float64(c.dbSize) / rate
		snap.Low, snap.High = t, snapshotStretch*t+0.2
		snap.Basis = fmt.Sprintf("the undo's snapshot of the %s database: "+how+", written and synced", textfmt.Bytes(c.dbSize), textfmt.Bytes(int64(rate)))
	}
	first := func(s float64) float64 { return max(c.window, checks+s) }
	window := fmt.Sprintf("the %.0fs liveness window", c.window)
	switch {
	case c.kine && c.server:
		window = fmt.Sprintf("no liveness window (a %s datastore: no other client connected to it)", c.serverKind)
	case c.kine:
		window = "no liveness window (a SQLite datastore: no other process holds it open)"
	case c.window == 0:
		window = "no liveness window (--allow-live-apiserver)"
	}

	// Reading, deciding and writing, all at once: the decision as timed
	// here; the writes' CPU (the tool's journal and client, etcd's applies)
	// on the cores beside it; etcd's applies one at a time; the journal's
	// fsyncs one after another, each shared by the batches in flight (a
	// group commit: at best one covers every writer's batch, at worst each
	// batch waits for its own).
	toolW := clientCPU
	if c.journal {
		toolW += c.journalWrite
	}
	if c.window > 0 {
		toolW += watchCPU
	}
	etcdW := etcdCPUPerApply * apply
	if c.window > 0 {
		etcdW += etcdWatchPerApply * apply
	}
	// What migrate decides while its first write waits is held on disk
	// (guard.Spool, then guard.Backlog, when it keeps an undo) and comes off
	// the part after the wait: at best the decision as fast as timed here,
	// at worst at half that beside the snapshot, either as far as their
	// room (the old and new values) allows.
	heldLow, heldHigh := 0.0, 0.0
	if c.journal && c.decideWall > 0 {
		room := 1.0
		if spooled, most := 2*float64(c.sizes.EtcdBytes), float64(guard.SpoolMax+guard.BacklogMax); spooled > most {
			room = most / spooled
		}
		heldLow = min(1, room, (first(snap.Low)-checks)/c.decideWall)
		heldHigh = min(1, room, (first(snap.High)-checks)/(2*c.decideWall))
	}
	decideLow, decideHigh := (1-heldLow)*c.decideWall, (1-heldHigh)*c.decideWall
	cpu := (1-heldLow)*c.decideCPU + s*(toolW+etcdW)
	cpuHigh := (1-heldHigh)*c.decideCPU + s*(toolW+etcdW)
	applyChain := s * apply
	journalChain, journalLow := 0.0, 0.0
	if c.journal {
		journalChain = batches * fsync
		rounds := math.Ceil(batches / writersInFlight)
		journalLow = rounds * fsync
		if c.etcd != nil && c.etcd.WALFsyncMedian > 0 {
			journalLow = rounds * min(fsync, c.etcd.WALFsyncMedian)
		}
	}
	bodyLow := max(decideLow, applyChain, journalLow, cpu/(cores*busyLow))
	// A journal's fsync waits for the filesystem's journal commit, which
	// etcd's WAL fsyncs on the same disk share: up to twice etcd's mean
	// (measured 1.6 × on the benchmark's rotation dataset), at least its
	// median (measured: 2.2 ms a batch against a mean of 3 ms that the
	// benchmark's ceilings' large transactions had raised).
	// The decision was timed here alone; beside the writes it shares the
	// cores with the tool's and etcd's work for them (the cr dataset:
	// decisions of 4.8 s alone, 5.4 s in the run).
	writesCPU := s * (toolW + etcdW)
	bodyHigh := max(1.25*decideHigh+writesCPU/(cores*busyHigh), 1.5*applyChain, 2*journalChain, cpuHigh/(cores*busyHigh))
	body := EstimatePart{Name: "decisions and writes", Low: bodyLow, High: bodyHigh,
		Basis: fmt.Sprintf("%d objects decided in %.1fs here (%.1fs of CPU), %.0f–%.0f%% of them while the first write waits; %d rewrites: %.0f µs of the tool's CPU each (journal %.0f µs, timed on a sample), %.0f µs of etcd's (its applies take %.0f µs a write), %.1fs of applies one at a time, %.0f to %.0f journal fsyncs of %.2f ms (the batches in flight share one); %.0f cores shared",
			c.scanned, c.decideWall, c.decideCPU, 100*heldHigh, 100*heldLow, c.stale, toolW*1e6, c.journalWrite*1e6, etcdW*1e6, apply*1e6, applyChain, math.Ceil(batches/writersInFlight), batches, fsync*1e3, cores)}
	if c.sqliteTimed() {
		// A SQLite datastore: no etcd, and its writes timed, not assumed.
		// kine, SQLite and the client run in this process; SQLite takes one
		// writer at a time, so the rewrites go one after another
		// (writeChain), and each costs the sample's CPU per write. At worst
		// the decisions do not overlap the writes at all.
		ws := c.writes
		toolW := ws.CPUSeconds / float64(ws.Writes)
		if c.journal {
			toolW += c.journalWrite
		}
		writeLow, writeHigh := c.writeChain()
		cpu := (1-heldLow)*c.decideCPU + s*toolW
		cpuHigh := (1-heldHigh)*c.decideCPU + s*toolW
		bodyLow = max(decideLow, writeLow, journalLow, cpu/(cores*busyLow))
		bodyHigh = max(1.25*decideHigh+writeHigh, 2*journalChain, cpuHigh/(cores*busyHigh))
		body.Low, body.High = bodyLow, bodyHigh
		body.Basis = fmt.Sprintf("%d objects decided in %.1fs here (%.1fs of CPU), %.0f–%.0f%% of them while the first write waits; %d rewrites, one after another (SQLite takes one writer at a time), %.1f–%.1fs (%.0f–%.0f µs each) as timed here: %d rewrites (%s) written to plan's private copy of the datastore through kine as migrate writes them (%d batches, %d writers in flight; the node's datastore not written) in %.1fs, scaled to the rewrite's %s by count and by size; %.0f µs of CPU each (kine, SQLite and the client, in this process; the journal %.0f µs of it); %.0f cores shared",
			c.scanned, c.decideWall, c.decideCPU, 100*heldHigh, 100*heldLow, c.stale, writeLow, writeHigh, writeLow/s*1e6, writeHigh/s*1e6, ws.Writes, textfmt.Bytes(ws.Bytes), ws.Batches, ws.Writers, ws.Seconds, textfmt.Bytes(c.sizes.EtcdBytes), toolW*1e6, c.journalWrite*1e6, cores)
	}

	// The compactions (--compact-history), as the space guard makes them.
	comp := EstimatePart{Name: "compactions", Basis: "none: the run does not compact (no --compact-history)"}
	if c.compact && c.stale > 0 {
		tcLow, tcHigh, tcBasis := c.compactionTime()
		lo := simulateGuard(c, bodyLow, tcLow, true)
		hi := simulateGuard(c, bodyHigh, tcHigh, false)
		e.Compactions = [2]int{min(lo.count, hi.count), max(lo.count, hi.count)}
		comp.Low, comp.High = lo.blocked, hi.blocked
		comp.Basis = fmt.Sprintf("%d–%d compaction(s), one every %s written (half the margin below the %s quota), each %.0f–%.0fs (%s); once the %s of room is used the writes wait for the room they free (as they walk at best, at their end at worst)",
			e.Compactions[0], e.Compactions[1], textfmt.Bytes(guard.Margin(c.quota)/2), textfmt.Bytes(c.quota), tcLow, tcHigh, tcBasis, textfmt.Bytes(max(c.quota-guard.Margin(c.quota)-c.dbSize+c.free, 0)))
	}

	// The end. The run directory's checksums of the snapshot and the
	// journal are taken as they are written (in the snapshot's and the
	// writes' parts): the end reads neither again. A compaction still
	// running is waited for only until etcd has taken it: its removing the
	// old revisions goes on in etcd after the run.
	end := EstimatePart{Name: "end", Basis: "the run's summary"}
	if c.journal || c.snapshot {
		end.High = 0.3
		end.Basis = "the undo's checksums, taken as its files were written (nothing read again)"
	}
	if e.Compactions[1] > 0 {
		end.High += 0.5
		end.Basis += "; the last compaction goes on in etcd after the run (the run waits for etcd to take it)"
	}

	e.Parts = []EstimatePart{setup, snap, body, comp, end}
	e.Low = setup.Low + first(snap.Low) + body.Low + comp.Low + end.Low
	e.High = setup.High + first(snap.High) + body.High + comp.High + end.High
	e.Seconds = (e.Low + e.High) / 2
	e.SnapshotSeconds = (snap.Low + snap.High) / 2
	e.WriteSeconds = (body.Low + body.High) / 2
	e.Basis = fmt.Sprintf("setup; the first write after the longer of %s and %s + the snapshot; the decisions and the writes together; the compactions' waits; the end", window, checksBasis)
	return e
}

// writeChain is how long the rewrite's writes take one after another on a
// SQLite datastore, at least and at most, from the sample timed on plan's
// copy of it (c.writes): its time scaled by the rewrite's share of it,
// counted in writes or in bytes — a write's time grows with both, so the
// share lies between the two — the least from its fastest round (the
// sample's first writes warm SQLite's cache), the most from the whole
// sample.
func (c costs) writeChain() (low, high float64) {
	ws := c.writes
	share := func(writes int, bytes int64) (lo, hi float64) {
		byCount := float64(c.stale) / float64(writes)
		bySize := byCount
		if bytes > 0 && c.sizes.EtcdBytes > 0 {
			bySize = float64(c.sizes.EtcdBytes) / float64(bytes)
		}
		return min(byCount, bySize), max(byCount, bySize)
	}
	total := 0.0
	for _, r := range ws.Rounds {
		total += r.Seconds
		if r.Writes == 0 {
			continue
		}
		lo, _ := share(r.Writes, r.Bytes)
		if t := r.Seconds * lo; low == 0 || t < low {
			low = t
		}
	}
	_, hi := share(ws.Writes, ws.Bytes)
	return low, max(low, total*hi)
}

// compactionTime is how long one of the run's compactions takes, at least
// and at most, and why. etcd compacts in batches (its defaults: 1,000
// revisions a batch, 10 ms apart), each batch a hold on its backend ended by
// a commit: a compaction walks every revision it keeps or removes (every
// key's latest, and those the run wrote since the last compaction). A
// batch's hold is etcd's own, from its compactions' pauses when it made some
// (kube-apiserver's, every 5 minutes), else its backend's commits; at best
// (low) no longer than those commits when they are the shorter.
func (c costs) compactionTime() (low, high float64, basis string) {
	keys := float64(c.scanned)
	if c.etcd != nil && c.etcd.Keys > 0 {
		keys = float64(c.etcd.Keys)
	}
	perPut := 2048.0
	if c.stale > 0 && c.sizes.EtcdBytes > 0 {
		perPut = float64(c.sizes.EtcdBytes) / float64(c.stale)
	}
	walked := keys + float64(guard.Margin(c.quota)/2)/perPut
	batches := math.Ceil(walked / compactionBatch)
	pause, how := defaultPause, "assumed"
	least := 0.0
	switch {
	case c.etcd != nil && c.etcd.CompactionPause > 0:
		pause, how = c.etcd.CompactionPause, "etcd's own compactions' pauses"
		// A batch's hold ends with a commit of its own: at best it is no
		// longer than the backend's commits. etcd's past compactions may
		// have paused longer than the run's will (a 4,000,000-key etcd:
		// 31.5 ms a batch in its compactions before, 13-19 in the run's).
		if b := c.etcd.BackendCommit; b > 0 && b < pause {
			least = b
		}
	case c.etcd != nil && c.etcd.BackendCommit > 0:
		pause, how = c.etcd.BackendCommit, "etcd's backend commits"
	}
	// etcd counts a pause in whole milliseconds, the fraction dropped.
	t := batches * (compactionSleep + pause)
	low = t
	if least > 0 {
		low = batches * (compactionSleep + least)
		how += fmt.Sprintf("; at best its backend's commits, %.1f ms", least*1e3)
	}
	return low, 2 * (t + batches*1e-3), fmt.Sprintf("%.0f revisions walked, %d a batch, %.0f ms apart, each batch's hold %.1f ms (%s)", walked, compactionBatch, compactionSleep*1e3, pause*1e3, how)
}

// guardRun is what simulateGuard found: the compactions made (the last
// may go on after the writes end), and the time the writes waited for them.
type guardRun struct {
	count   int
	blocked float64
}

// simulateGuard plays the space guard's compactions (guard.SpaceGuard) over
// the rewrite: the writes go at the rate body allows; every half margin
// written a compaction starts in the background if none runs, taking tc,
// and frees the old revisions of what was written before it started; a
// write that would take the database into the margin waits for the running
// compaction, or starts one and waits for it. It waits for the room it
// needs: etcd frees the old values as its compaction walks the revisions,
// wherever they are in it; progressive (the low end) has them freed evenly
// over the compaction's time, otherwise (the high end) all at its end.
func simulateGuard(c costs, body, tc float64, progressive bool) guardRun {
	total := float64(c.sizes.EtcdBytes)
	if total <= 0 || body <= 0 {
		return guardRun{}
	}
	margin := float64(guard.Margin(c.quota))
	every := margin / 2
	room := float64(c.quota) - margin - float64(c.dbSize) // growth allowed
	free := float64(c.free)
	// What a compaction frees per byte written: the old values' pages.
	freeing := 1.0
	if c.sizes.EtcdBytes > 0 && c.sizes.RollbackBytes > 0 {
		freeing = float64(c.sizes.RollbackBytes) / float64(c.sizes.EtcdBytes)
	}
	rate := total / body
	step := max(min(every/8, total/2000), 4096)
	var r guardRun
	var t, written, grown, since, lastStart, credited float64
	running, startAt, endAt := false, 0.0, 0.0
	// pending is what the running compaction frees in all.
	pending := func() float64 { return (startAt - lastStart) * freeing }
	// credit adds what the running compaction has freed by now (progressive).
	credit := func() {
		if running && progressive && tc > 0 {
			by := pending() * min(1, max(0, (t-(endAt-tc))/tc))
			free += by - credited
			credited = by
		}
	}
	finish := func() {
		free += pending() - credited
		lastStart, running, credited = startAt, false, 0
		r.count++
	}
	start := func() {
		running, startAt, endAt, since = true, written, t+tc, 0
	}
	fits := func(d float64) bool { return grown+max(0, d-free) <= room }
	for written < total {
		d := min(step, total-written)
		if running && t >= endAt {
			finish()
		}
		if !running && since >= every {
			start()
		}
		credit()
		if !fits(d) {
			if running && progressive && pending() > credited {
				// The time the missing room takes to free, at most the rest.
				need := grown + d - free - room
				until := min(endAt, t+need/pending()*tc)
				r.blocked += until - t
				t = until
				credit()
			}
			if running && !fits(d) {
				r.blocked += endAt - t
				t = endAt
				finish()
			}
			if !fits(d) && written > lastStart {
				start()
				r.blocked += tc
				t += tc
				finish()
			}
			if !fits(d) {
				break // the run would stop at the quota: plan blocks it already
			}
		}
		use := min(d, free)
		free -= use
		grown += d - use
		written += d
		since += d
		t += d / rate
	}
	if running && endAt > t {
		r.count++
	}
	return r
}

// errNoKineMetrics is why etcd's costs are not read on a datastore served
// through kine: on SQLite its writes are timed instead, on plan's private
// copy of it (sampleWrites); on PostgreSQL they are assumed.
var errNoKineMetrics = errors.New("a datastore served through kine has no etcd metrics")

// etcdCosts picks the slowest member's costs out of their metrics.
func etcdCostsOf(ms []etcdscan.MemberMetrics, err error) *EtcdCosts {
	var out *EtcdCosts
	for _, m := range ms {
		if m.Writes <= 0 || m.Apply.Count == 0 {
			continue
		}
		c := EtcdCosts{Metrics: m.URL, ApplyPerWrite: m.Apply.Sum / float64(m.Writes), WALFsync: m.WALFsync.Mean(), WALFsyncMedian: m.WALFsync.Quantile(0.5), BackendCommit: m.BackendCommit.Mean(),
			Compaction: m.Compaction.Mean(), CompactionPause: m.CompactionPause.Mean(), Keys: m.Keys}
		if out == nil || c.ApplyPerWrite > out.ApplyPerWrite {
			out = &c
		}
	}
	if err != nil {
		if out == nil {
			out = &EtcdCosts{}
		}
		out.Error = textfmt.OneLine(err.Error())
	}
	if out != nil && out.ApplyPerWrite == 0 && out.Error == "" {
		return nil
	}
	return out
}

// sampleSize is how many stale objects plan keeps to time the journal's
// code on; sampleCap the most of a value it keeps (a larger one's time is
// scaled by its size).
const (
	sampleSize = 128
	sampleCap  = 256 << 10
	// snapshotSample is how much of etcd's snapshot stream plan reads.
	snapshotSample = 64 << 20
)

// sampled is one stale object of the sample: its rewrite, its stored
// value, and how much larger the whole is than what was kept.
type sampled struct {
	put   etcdscan.Put
	old   []byte
	scale float64
}

// sampler keeps a uniform sample of the stale decisions of a dry run
// (reservoir sampling, a fixed seed: the same keyspace, the same sample).
type sampler struct {
	mu    sync.Mutex
	n     int
	seen  int64
	items []sampled
	rnd   *rand.Rand
	// The write sample (a SQLite copy's: sampleWrites): a uniform sample
	// of chunkN of migrate's batches of batchOps stale keys (0: none kept).
	chunkN, batchOps int
	chunkSeen        int64
	chunks           [][]writeItem
}

func newSampler(n int) *sampler { return &sampler{n: n, rnd: rand.New(rand.NewPCG(1, 2))} }

// page is migrate's Decided: it sees each page of decisions.
func (s *sampler) page(page []reencode.Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.chunkN > 0 {
		s.chunkPage(page)
	}
	for i := range page {
		d := &page[i]
		if d.Status != reencode.Stale {
			continue
		}
		s.seen++
		switch {
		case len(s.items) < s.n:
			s.items = append(s.items, sampledOf(d))
		default:
			if j := s.rnd.Int64N(s.seen); j < int64(s.n) {
				s.items[j] = sampledOf(d)
			}
		}
	}
}

func sampledOf(d *reencode.Decision) sampled {
	old, nv := d.OldValue[:min(len(d.OldValue), sampleCap)], d.NewValue[:min(len(d.NewValue), sampleCap)]
	scale := 1.0
	if kept := len(old) + len(nv); kept > 0 {
		scale = float64(len(d.OldValue)+len(d.NewValue)) / float64(kept)
	}
	return sampled{put: etcdscan.Put{Key: d.Key, Value: bytes.Clone(nv), ModRevision: d.ModRevision}, old: bytes.Clone(old), scale: scale}
}

// journalCost is the journal's CPU per rewrite on the sample: writing its
// records, reading them back (seconds).
func (s *sampler) journalCost() (write, read float64) {
	if len(s.items) == 0 {
		return 0, 0
	}
	// Twice: the first warms the code and the buffers.
	for range 2 {
		write, read = 0, 0
		for _, it := range s.items {
			w, r, _ := undo.JournalCost([]etcdscan.Put{it.put}, [][]byte{it.old})
			write += w.Seconds() * it.scale
			read += r.Seconds() * it.scale
		}
	}
	n := float64(len(s.items))
	return write / n, read / n
}

// hashRate is sha256's rate here (bytes/s), as the run's end hashes its
// snapshot.
func hashRate() float64 {
	buf := make([]byte, 4<<20)
	best := 0.0
	// The best of three: a trial the scheduler paused says nothing of the rate.
	for range 3 {
		h := sha256.New()
		start := time.Now()
		h.Write(buf)
		h.Sum(nil)
		best = max(best, float64(len(buf))/max(time.Since(start).Seconds(), 1e-6))
	}
	return best
}

// estimate gathers what the estimate needs that the plan has not measured
// yet (the samples; etcd's space and costs), then builds it.
func (p *Plan) estimate(ctx context.Context, env *pipeline.Env, opts Options, c costs, sum *migrate.Summary, smp *sampler, metrics []etcdscan.MemberMetrics, merr error) Estimate {
	mo := opts.Migrate
	c.scanned, c.stale = sum.Summary.Scanned, sum.Summary.Stale
	if sum.WriteSizes != nil {
		c.sizes = *sum.WriteSizes
	}
	// On a SQLite datastore the window is the file's holders, looked at
	// once (guard.StartProbeWatch): no time to wait.
	c.kine = env.Target.APIServer().OnKine()
	if !mo.AllowLiveAPIServer && !c.kine {
		c.window = mo.LivenessWindow.Seconds()
		if mo.LivenessWindow <= 0 {
			c.window = liveness.DefaultWindow.Seconds()
		}
	}
	c.journal = opts.StateDir != "" || mo.Journal != ""
	c.snapshot = (opts.StateDir != "" || mo.Snapshot != "") && env.Target.APIServer().KineServer == ""
	c.server = env.Target.APIServer().KineServer != ""
	c.serverKind = env.Target.APIServer().KineServerKind()
	c.compact = mo.CompactHistory
	c.etcd = etcdCostsOf(metrics, merr)
	if st, err := etcdscan.Status(ctx, env.Client); err == nil {
		c.dbSize, c.free = st.DBSize, st.Free
	}
	c.quota = guard.QuotaOf(ctx, env.Client, env.Target.APIServer(), mo.QuotaBackendBytes, mo.Spell).Bytes
	if c.journal {
		c.journalWrite, c.journalRead = smp.journalCost()
	}
	c.hashRate = hashRate()
	if c.snapshot && c.dbSize > 0 {
		if n, el, err := etcdscan.SnapshotSample(ctx, env.Client, snapshotSample); err == nil && n > 0 && el > 0 {
			c.snapshotRate = float64(n) / el.Seconds()
		}
	}
	// On a SQLite datastore, the writes timed on plan's own copy of it,
	// last: nothing reads the copy after them. PostgreSQL's are not (plan
	// reads the live database there and writes nothing to it): its
	// estimate stays the model of etcd's costs, assumed.
	if timesWrites(env, opts) {
		c.copied = opts.SQLiteCopy.Copied.Seconds()
		if c.stale > 0 {
			writers := mo.Writers
			if writers <= 0 {
				writers = batches.DefaultWriters
			}
			ws := smp.sampleWrites(ctx, env.Client, opts.SQLiteCopy, writers)
			c.writes = &ws
		}
	}
	return estimate(c)
}
