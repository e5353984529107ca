package guard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"kube-etcd-migrate/etcdscan"
	"kube-etcd-migrate/internal/input"
	"kube-etcd-migrate/internal/textfmt"
	"kube-etcd-migrate/undo"
)

// CheckRollbackQuota says whether undoing the journals fits below etcd's
// quota less the margin, or, with compact, can be made to fit by compacting
// as it goes, with a line per finding (spell names the operator's inputs;
// nil: words); a refusal is a *PreflightError. What
// the rollback writes is the old value of every record it undoes (at most:
// keys changed since or never written are left), bounded first by three
// times the journals' size, then added up from their records.
func CheckRollbackQuota(ctx context.Context, cli *clientv3.Client, journals []string, quota Quota, compact bool, spell func(input.Name) string) ([]string, error) {
	st, err := etcdscan.Status(ctx, cli)
	if err != nil {
		return nil, err
	}
	var bound int64
	for _, j := range journals {
		bound += 3 * FileSize(j)
	}
	exact := func() (int64, error) { return RollbackBytes(journals) }
	// What the rollback puts back is what the runs replaced: their old
	// values, history until a compaction frees it.
	return fitQuota(st, quota, writeSize{what: "rollback", bound: bound, exact: exact, replaced: exact}, compact, spell)
}

// CheckWriteQuota says whether a run that writes writes bytes more (PutCost
// of each write, added up) and compacts nothing fits below etcd's quota less
// the margin, reusing the pages free in the database first, with a line per
// finding (what names the run, e.g. "restore"); a refusal is a
// *PreflightError whose remedy is etcd's own compaction and defragmentation,
// or fewer objects at a time (the namespace and resource inputs).
func CheckWriteQuota(ctx context.Context, cli *clientv3.Client, quota Quota, what string, writes int64) ([]string, error) {
	st, err := etcdscan.Status(ctx, cli)
	if err != nil {
		return nil, err
	}
	margin := Margin(quota.Bytes)
	done := []string{quota.line(margin)}
	if quota.Server {
		return append(done, fmt.Sprintf("database %s + %s about %s: make sure the server has that room", textfmt.Bytes(st.DBSize), what, textfmt.Bytes(writes))), nil
	}
	if room := quota.Bytes - margin - st.DBSize + st.Free; writes > room {
		return done, &PreflightError{Err: input.Errorf("the %s would add about %s to a %s database (%s of it free), past etcd's %s quota less the %s margin (quota from %s); compact and defragment etcd first ('etcdctl compact', then 'etcdctl defrag' on every member), raise its --quota-backend-bytes, or %s fewer objects at a time (%s, %s)",
			what, textfmt.Bytes(writes), textfmt.Bytes(st.DBSize), textfmt.Bytes(st.Free), textfmt.Bytes(quota.Bytes), textfmt.Bytes(margin), quota.Source, what, input.Namespace, input.Resource)}
	}
	return append(done, fmt.Sprintf("database %s + %s about %s fits below the quota", textfmt.Bytes(st.DBSize), what, textfmt.Bytes(writes))), nil
}

// RollbackBytes adds up what undoing every record of the journals writes to
// etcd's backend (putCost): each overwrite's and re-creation's old value
// (its length from the base64, not decoded), each removal's deletion. A
// record that does not parse ends the count of its journal: a torn last
// record undoes nothing, and rollback refuses a damaged earlier one.
func RollbackBytes(journals []string) (int64, error) {
	return undo.UndoWrites(journals, putCostN)
}

// RollbackSpace is where a rollback keeps its own undo, and what it knows of
// etcd, for CheckRollbackSpace.
type RollbackSpace struct {
	// Dir is the directory its snapshot and journal go to, and DirInput
	// the input that names it: the state directory, or the rollback's
	// undo directory. A refusal for room names the undo directory as the
	// remedy either way: another state directory would not have the runs.
	Dir      string
	DirInput input.Name
	// Etcd is etcd's data directory on this host (FindEtcdData), Quota
	// etcd's quota: etcd's growth from the rollback is counted on its
	// filesystem.
	Etcd  EtcdData
	Quota int64
}

// CheckRollbackSpace says whether a rollback's own undo fits in sp.Dir
// (made, mode 0700, if need be): a snapshot of etcd's database and a journal
// about the size of the journals it undoes, with etcd's own growth from what
// it writes back on the filesystem of etcd's data directory (at most three
// times the journals' size, else added up from their records); a line per
// filesystem; a refusal is a *PreflightError.
func CheckRollbackSpace(ctx context.Context, cli *clientv3.Client, sp RollbackSpace, journals []string) ([]string, error) {
	st, err := etcdscan.Status(ctx, cli)
	if err != nil {
		return nil, err
	}
	if sp.DirInput == "" {
		sp.DirInput = input.StateDir
	}
	if err := os.MkdirAll(sp.Dir, 0o700); err != nil {
		return nil, input.Errorf("%s: %w; nothing was written", sp.DirInput, err)
	}
	if fi, err := os.Stat(sp.Dir); err != nil {
		return nil, input.Errorf("%s: %w; nothing was written", sp.DirInput, err)
	} else if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, input.Errorf("%s %s has mode %v: it will hold stored values (secrets among them); make it private first (chmod 700 %s); nothing was written", sp.DirInput, sp.Dir, perm, sp.Dir)
	}
	var journal int64
	for _, j := range journals {
		journal += FileSize(j)
	}
	space := RunSpace{
		Snapshot: filepath.Join(sp.Dir, undo.SnapshotFile), Journal: filepath.Join(sp.Dir, undo.JournalFile), JournalBytes: journal,
		Writes: 3 * journal, Etcd: sp.Etcd, Status: st, Quota: sp.Quota,
	}
	lines, err := CheckDiskSpace(space.Needs())
	var se *DiskSpaceError
	if errors.As(err, &se) && sp.Etcd.Dir != "" {
		if space.Writes, err = RollbackBytes(journals); err != nil {
			return nil, err
		}
		lines, err = CheckDiskSpace(space.Needs())
	}
	if errors.As(err, &se) {
		se.Elsewhere = input.UndoDir
		return lines, &PreflightError{Err: se}
	}
	if sp.Etcd.Dir == "" {
		lines = append(lines, "etcd's data directory on this host: "+sp.Etcd.Source+"; its growth is not counted")
	}
	return lines, err
}

// RollbackAlarms refuses a rollback while etcd has an alarm: rollback writes
// too, and under an alarm etcd refuses every write.
func RollbackAlarms(ctx context.Context, cli *clientv3.Client, journals []string) error {
	alarms, err := etcdscan.Alarms(ctx, cli)
	if err != nil {
		return err
	}
	if len(alarms) > 0 {
		return fmt.Errorf("rollback writes too, and etcd has active alarms: %s; make room first ('etcdctl compact REV' at the current revision, 'etcdctl defrag' on every member, then 'etcdctl alarm disarm'; or raise etcd's --quota-backend-bytes), then run the same rollback again (nothing was written; the journal %s is unchanged)", strings.Join(alarms, "; "), strings.Join(journals, ", "))
	}
	return nil
}
