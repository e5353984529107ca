// Package plan answers, read-only and while kube-apiserver still runs, every
// question migrate asks before its first write except whether a kube-apiserver
// is alive: what would be rewritten per resource and why, which fields of
// which custom resources the rewrite would drop, what could not be
// read (and so would be left), whether the rewrite fits below etcd's quota,
// whether its undo fits on the state directory's filesystem, whether every
// write encryption provider (KMS plugins included) answers, whether every etcd
// member is healthy, which custom resources need a conversion webhook, and
// about how long the write would take on this machine. Each problem is a
// Blocker with its remedy, so that it is fixed before the outage begins,
// not inside it. It writes nothing: not to etcd, not to the state directory,
// not to a datastore served through kine; on a SQLite datastore it writes
// only its own private copy of it (SQLiteCopy), to time migrate's writes.
package plan

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"kube-etcd-migrate/customresource"
	"kube-etcd-migrate/decode"
	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/migrate"
	"kube-etcd-migrate/pipeline"
	"kube-etcd-migrate/reencode"
	"kube-etcd-migrate/undo"
)

// Options say what migrate would be run with.
type Options struct {
	// Migrate are the options the migrate run would take (CompactHistory,
	// QuotaBackendBytes, batching); DryRun and the undo paths are set here.
	Migrate migrate.Options
	// StateDir is where the run's undo would go ("" with --no-undo).
	StateDir undo.StateDir
	// Started is when the command began (its setup counts in the
	// estimate: migrate's is the same); zero: when Run began.
	Started time.Time
	// SQLiteCopy, when the datastore env reads is plan's private copy of a
	// SQLite datastore (and only then), lets plan time a sample of
	// migrate's writes on that copy for the estimate (nil: plan writes
	// nothing).
	SQLiteCopy *SQLiteCopy
}

// Blocker is one reason migrate would refuse, or would stop part-way.
type Blocker struct {
	Check   string `json:"check"`
	Problem string `json:"problem"`
	// Fix is what mends it. Remedy, empty here, is Fix in words with the
	// flags that apply: the command layer's printers fill it in the copy
	// they print (the table's "remedy:" and this JSON member).
	Fix    Fix    `json:"-"`
	Remedy string `json:"remedy"`
	// Cause is the error Problem says, when one did: the command layer
	// writes it again naming its flags.
	Cause error `json:"-"`
}

// Fix names the remedy of a blocker.
type Fix string

const (
	// FixMember: bring a member that does not answer back, or remove it.
	FixMember Fix = "member"
	// FixMemberErrors: resolve what a member reports.
	FixMemberErrors Fix = "member-errors"
	// FixQuorum: restore etcd's quorum.
	FixQuorum Fix = "quorum"
	// FixAlarm: make room and disarm etcd's alarm.
	FixAlarm Fix = "alarm"
	// FixConversionWebhook: reach the webhook through its endpoints, or give one.
	FixConversionWebhook Fix = "conversion-webhook"
	// FixQuota: compact and defragment, compact as the run goes, or a larger quota.
	FixQuota Fix = "quota"
	// FixStateDir: the state directory's mode, the run that holds it, or another one.
	FixStateDir Fix = "state-dir"
	// FixDiskSpace: room for the undo or for etcd's growth, or a state directory elsewhere.
	FixDiskSpace Fix = "disk-space"
	// FixEncryption: a KMS plugin that answers, or a key that works.
	FixEncryption Fix = "encryption"
)

// WebhookCheck is whether a CRD's conversion webhook answered from here:
// it converted the objects the decision needed converted, or, when none
// needed it, completed a TLS handshake checked as kube-apiserver's client
// checks it.
type WebhookCheck struct {
	CRD         string `json:"crd"`
	Target      string `json:"target"`
	Given       string `json:"given,omitempty"` // the address given for its service
	Answered    bool   `json:"answered"`
	Address     string `json:"address,omitempty"`
	Conversions int64  `json:"conversions"`
	Failures    int64  `json:"failures"`
	Error       string `json:"error,omitempty"`
}

// Plan is the answer.
type Plan struct {
	Revision   int64                     `json:"revision"`
	Consistent bool                      `json:"consistent"`
	Summary    migrate.Counts            `json:"summary"`
	Resources  []migrate.ResourceSummary `json:"resources"`
	Causes     []migrate.FailureCause    `json:"unreadable,omitempty"`
	CRDs       []migrate.CRDResult       `json:"crds,omitempty"`
	// FieldLoss: the fields the rewrite would drop, per custom resource
	// and stored version, with the objects that carry each (paths and
	// counts, never values).
	FieldLoss []reencode.FieldLoss    `json:"fieldLoss,omitempty"`
	Webhooks  []WebhookCheck          `json:"conversionWebhooks,omitempty"`
	Members   []etcdscan.MemberHealth `json:"members"`
	Checks    []string                `json:"checks"`
	// Undo is whether a rollback of the run would fit below etcd's quota
	// after the rewrite, or need its compaction (nil when the run keeps no
	// undo, or the quota check did not run or blocked).
	Undo       *guard.UndoFit `json:"undo,omitempty"`
	Blockers   []Blocker      `json:"blockers"`
	Estimate   Estimate       `json:"estimate"`
	StateDir   undo.StateDir  `json:"stateDir,omitempty"`
	DurationMs int64          `json:"durationMs"`
}

// Proceeds says whether migrate would go ahead.
func (p *Plan) Proceeds() bool { return len(p.Blockers) == 0 }

// Run makes the plan. An error is returned only when the plan itself could
// not be made (etcd unreachable); everything migrate would refuse is a Blocker.
func Run(ctx context.Context, env *pipeline.Env, opts Options) (*Plan, error) {
	start := time.Now()
	setup := 0.0
	if !opts.Started.IsZero() {
		setup = start.Sub(opts.Started).Seconds()
	}
	p := &Plan{Blockers: []Blocker{}, StateDir: opts.StateDir}
	defer func() { p.DurationMs = time.Since(start).Milliseconds() }()

	// etcd's members, one by one: a member down is found now, not mid-run.
	members, err := etcdscan.Health(ctx, env.Client)
	if err != nil {
		return p, err
	}
	p.Members = members
	leader := false
	for _, m := range members {
		leader = leader || m.Leader
		switch {
		case m.Err != "":
			p.block("etcd members", fmt.Sprintf("member %s (%s) does not answer: %s", m.Name, m.Endpoint, m.Err), FixMember)
		case len(m.Errors) > 0:
			p.block("etcd members", fmt.Sprintf("member %s (%s) reports %v", m.Name, m.Endpoint, m.Errors), FixMemberErrors)
		default:
			p.Checks = append(p.Checks, fmt.Sprintf("etcd member %s (%s): etcd %s, database %s", m.Name, m.Endpoint, m.Version, textfmt.Bytes(m.DBSize)))
		}
	}
	if !leader && len(members) > 0 {
		p.block("etcd members", "no member says it is the leader", FixQuorum)
	}
	alarms, err := etcdscan.Alarms(ctx, env.Client)
	if err != nil {
		return p, err
	}
	if len(alarms) > 0 {
		p.block("etcd alarms", fmt.Sprintf("etcd has active alarms: %v", alarms), FixAlarm)
	}
	preflight := len(members) > 0 && p.Proceeds()

	// What etcd reports of its own costs, for the estimate.
	var metrics []etcdscan.MemberMetrics
	merr := errNoKineMetrics
	if !env.Target.APIServer().OnKine() {
		metrics, merr = etcdscan.Metrics(ctx, env.Client, etcdscan.KubeadmMetricsURL)
	}

	// The decision over every object, as migrate makes it (a dry run), with
	// a sample of the stale objects kept for the estimate.
	mopts := opts.Migrate
	mopts.DryRun, mopts.Journal, mopts.Snapshot = true, "", ""
	smp := newSampler(sampleSize)
	if timesWrites(env, opts) {
		smp.chunkN, smp.batchOps = writeChunks, mopts.BatchOps
		if smp.batchOps <= 0 {
			smp.batchOps = etcdscan.DefaultMaxOps
		}
	}
	mopts.Decided = smp.page
	cpu0 := cpuTime()
	decideStart := time.Now()
	sum, err := migrate.Run(ctx, env, mopts)
	if err != nil {
		return p, err
	}
	c := costs{cores: runtime.NumCPU(), setup: setup, decideWall: time.Since(decideStart).Seconds(), decideCPU: (cpuTime() - cpu0).Seconds()}
	if preflight {
		// migrate's checks, with the sizes of the rewrite and its journal
		// this decision added up (no second pass over the keys): whether
		// migrate's own would make that pass is counted.
		opts.Migrate.Sizes = sum.WriteSizes
		opts.Migrate.SizesAsked = func() { c.sizingPass = true }
		checkStart := time.Now()
		p.preflight(ctx, env, opts)
		c.checks = time.Since(checkStart).Seconds()
	}
	p.Revision, p.Consistent, p.Summary, p.Resources, p.Causes, p.CRDs = sum.Revision, sum.Consistent, sum.Summary, sum.Resources, sum.Causes, sum.CRDs
	p.FieldLoss = sum.FieldLoss
	for _, c := range sum.Causes {
		if c.Cause == string(decode.ReasonConversionFailed) {
			p.block("conversion webhooks", fmt.Sprintf("%d object(s) could not be converted, e.g. %s: %s", c.Count, c.FirstKey, c.Error), FixConversionWebhook)
		}
	}
	p.checkWebhooks(ctx, env)
	p.Estimate = p.estimate(ctx, env, opts, c, sum, smp, metrics, merr)
	return p, nil
}

// preflight runs migrate's own checks, each on its own, so that every blocker
// is named at once.
func (p *Plan) preflight(ctx context.Context, env *pipeline.Env, opts Options) {
	lines, fit, err := guard.CheckQuota(ctx, env, opts.Migrate.PreflightOptions)
	p.Checks = append(p.Checks, lines...)
	if err != nil {
		p.blockErr("etcd quota", err, FixQuota)
	} else if opts.StateDir != "" || opts.Migrate.Journal != "" {
		// The run keeps an undo: would its rollback fit?
		p.Undo = fit
	}
	if opts.StateDir != "" {
		if err := opts.StateDir.Check(); err != nil {
			p.block("state directory", err.Error(), FixStateDir)
		}
		// The run directory does not exist yet: its filesystem is the nearest
		// directory that does.
		mopts := opts.Migrate
		mopts.Journal, mopts.Snapshot = opts.StateDir.NextRunFiles()
		mopts.StateDir = opts.StateDir
		if server := env.Target.APIServer().KineServer; server != "" {
			// A database server's datastore: no snapshot; the dump the
			// operator takes first is the way back beyond the journal.
			mopts.Snapshot = ""
			api := env.Target.APIServer()
			p.Checks = append(p.Checks, fmt.Sprintf("the run's undo is its journal alone: %s has no snapshot the tool can take; take a dump of the database first (%s: %s) and keep it until the run is verified", api.KineServerKind(), server, api.KineServerDump()))
		}
		lines, err := guard.CheckUndoSpace(ctx, env, mopts.PreflightOptions)
		p.Checks = append(p.Checks, lines...)
		if err != nil {
			p.blockErr("disk space", err, FixDiskSpace)
		}
	}
	if err := guard.CheckEncryption(ctx, env); err != nil {
		p.blockErr("encryption providers", err, FixEncryption)
	} else {
		p.Checks = append(p.Checks, "write encryption providers encrypt and decrypt a probe value")
	}
}

// webhookReporter is a custom resource codec that says what its CRD's
// conversion webhook did (customresource.Codec).
type webhookReporter interface {
	Webhook(ctx context.Context) (customresource.WebhookStatus, bool)
}

// checkWebhooks reports, for each CRD with a conversion webhook, whether it
// answered. One that failed conversions is already a blocker (the decision's
// causes); one that nothing needed and that does not answer is reported, not
// a blocker: migrate does not call it, though kube-apiserver will.
func (p *Plan) checkWebhooks(ctx context.Context, env *pipeline.Env) {
	for _, crd := range env.CRDs {
		if crd.Object == nil || crd.Object.Spec.Conversion == nil || crd.Object.Spec.Conversion.Strategy != "Webhook" {
			continue
		}
		check := WebhookCheck{CRD: crd.Object.Name}
		r, ok := crd.Codec.(webhookReporter)
		if !ok {
			check.Error = "its custom resources cannot be read"
			if crd.Err != nil {
				check.Error = crd.Err.Error()
			}
			p.Webhooks = append(p.Webhooks, check)
			continue
		}
		st, ok := r.Webhook(ctx)
		if !ok {
			continue
		}
		check.Target, check.Given, check.Answered, check.Address, check.Conversions, check.Failures, check.Error = st.Target, st.Given, st.Answered, st.Address, st.Conversions, st.Failures, st.Err
		p.Webhooks = append(p.Webhooks, check)
	}
}

func (p *Plan) block(check, problem string, fix Fix) {
	p.Blockers = append(p.Blockers, Blocker{Check: check, Problem: problem, Fix: fix})
}

func (p *Plan) blockErr(check string, err error, fix Fix) {
	var pe *guard.PreflightError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	p.Blockers = append(p.Blockers, Blocker{Check: check, Problem: err.Error(), Fix: fix, Cause: err})
}
