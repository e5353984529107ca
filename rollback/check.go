package rollback

import (
	"context"
	"kube-etcd-migrate/apiserverconfig"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/encryption"
	"kube-etcd-migrate/guard"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/undo"
)

// CheckConfig is what a rollback checks in one etcd before its first write on
// any: the journals it undoes there, newest first, and how.
type CheckConfig struct {
	Journals []undo.JournalSpec
	// WayBack is the run whose snapshot is the state the rollback returns
	// to, named when a journal is damaged.
	WayBack *undo.Record
	// Prefix is etcd's prefix, for a journal whose begin record names none.
	Prefix string
	// Encryption is the cluster's encryption configuration, each value put
	// back decrypted with it; nil: none was given (the values are counted by
	// their envelope).
	Encryption      *encryption.Transformers
	AllowUnverified bool
	DryRun          bool
	CompactHistory  bool
	// Manifest is kube-apiserver's manifest on this host when the etcd is
	// the main one ("" otherwise): etcd's quota and data directory are
	// found through it. QuotaBackendBytes is --quota-backend-bytes (0: not
	// given).
	Manifest          string
	QuotaBackendBytes int64
	// Kine, when set, is kube-apiserver's configuration whose datastore the
	// rollback writes through kine (OnKine): no etcd quota, what
	// guard.KineQuota says instead.
	Kine *apiserverconfig.Config
	// Room, when set, is where the rollback's own undo goes: its room is
	// checked (not in a dry run).
	Room  *UndoRoom
	Spell func(input.Name) string
}

// UndoRoom is where a rollback keeps its own undo, for the check of its
// room: Dir and the input that names it (the state directory, or the
// rollback's undo directory), and etcd's data directory as the installer
// found it on the node (EtcdDataDir, EtcdDataFrom; "" when not found).
type UndoRoom struct {
	Dir                       string
	DirInput                  input.Name
	EtcdDataDir, EtcdDataFrom string
}

// Checked is what Check found.
type Checked struct {
	// Undo is the journals' verification.
	Undo *undo.UndoCheck
	// Preflight is the checks passed, for the run's plan and report.
	Preflight []string
	// Refused, in a dry run, is why the rollback would be refused (nil: it
	// would run).
	Refused error
	// Quota is etcd's quota as found (the rollback keeps its writes below
	// it: RollbackOptions.Quota).
	Quota guard.Quota
}

// Check reads every journal of cfg whole, every value put back decrypted,
// then checks etcd for what the rollback writes (no alarm, room below the
// quota) and, with cfg.Space, the room of its own undo: all before the
// first write. A refusal is an error, unless a dry run, whose Checked says
// it. An error of the journals' verification is returned as CheckUndo
// gives it (an *undo.PluginStopError when a KMS plugin stopped).
func Check(ctx context.Context, cli *clientv3.Client, cfg CheckConfig) (*Checked, error) {
	var quota guard.Quota
	if cfg.Kine.OnKine() {
		quota = guard.KineQuota(cfg.Kine)
	} else {
		quota = guard.FindQuota(ctx, cli, cfg.Manifest, cfg.QuotaBackendBytes, cfg.Spell)
	}
	opts := undo.UndoOptions{CheckOptions: undo.CheckOptions{Prefix: cfg.Prefix}, WayBack: cfg.WayBack}
	if cfg.Encryption != nil {
		opts.Configured, opts.Encryption = true, cfg.Encryption
	}
	check, err := undo.CheckUndo(ctx, cfg.Journals, opts)
	if err != nil {
		return nil, err
	}
	c := &Checked{Undo: check, Preflight: check.Lines(), Quota: quota}
	refusal := check.Refusal(cfg.AllowUnverified)
	if refusal != nil && !cfg.DryRun {
		return c, refusal
	}
	journals := make([]string, len(cfg.Journals))
	for i, s := range cfg.Journals {
		journals[i] = s.Path
	}
	if !cfg.DryRun {
		if err := guard.RollbackAlarms(ctx, cli, journals); err != nil {
			return c, err
		}
		if r := cfg.Room; r != nil {
			found := guard.EtcdData{Dir: r.EtcdDataDir, Source: r.EtcdDataFrom}
			sp := guard.RollbackSpace{Dir: r.Dir, DirInput: r.DirInput, Etcd: guard.FindEtcdData(cfg.Manifest, found), Quota: quota.Bytes}
			lines, err := guard.CheckRollbackSpace(ctx, cli, sp, journals)
			c.Preflight = append(c.Preflight, lines...)
			if err != nil {
				return c, err
			}
		}
	}
	// etcd's room for what the rollback writes (a dry run says it too).
	lines, refused := guard.CheckRollbackQuota(ctx, cli, journals, quota, cfg.CompactHistory, cfg.Spell)
	c.Preflight = append(c.Preflight, lines...)
	if refused != nil && !cfg.DryRun {
		return c, refused
	}
	c.Refused = refusal
	if c.Refused == nil {
		c.Refused = refused
	}
	return c, nil
}
