package rollback

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"kube-etcd-migrate/undo"
)

// EtcdJournals are the journals a rollback undoes in one etcd, newest run
// first, and the run whose snapshot of that etcd is the state the rollback
// returns to (named when a journal is damaged).
type EtcdJournals struct {
	// Name is "" for the main etcd, else the etcd's name in
	// --etcd-servers-overrides; Endpoints are the ones its runs recorded.
	Name      string
	Endpoints []string
	Specs     []undo.JournalSpec
	WayBack   *undo.Record
}

// Paths are the journals' files, in the order they are undone.
func (e *EtcdJournals) Paths() []string {
	out := make([]string, len(e.Specs))
	for i, s := range e.Specs {
		out[i] = s.Path
	}
	return out
}

// Prefix is etcd's prefix as the journals' begin records name it ("" when
// none does).
func (e *EtcdJournals) Prefix() string { return undo.JournalsPrefix(e.Paths()) }

// Choice is what a rollback undoes: the main etcd's journals, the other
// etcds' (a run over several, --etcd-servers-overrides), and the runs
// undone.
type Choice struct {
	Main   EtcdJournals
	Others []*EtcdJournals
	// Undoes are the IDs of the runs undone (none for one journal).
	Undoes []string
}

// JournalGoneError refuses a rollback of a run that wrote keys but whose
// journal is gone: it cannot be undone; its snapshot is the way back.
type JournalGoneError struct {
	Run      string
	Keys     int64
	Journal  string
	Snapshot string
}

func (e *JournalGoneError) Error() string {
	return fmt.Sprintf("run %s wrote %d key(s) but its journal %s is gone: it cannot be undone (its snapshot %s is the way back)", e.Run, e.Keys, e.Journal, e.Snapshot)
}

// ChooseJournal is the rollback of one journal, with the run of dir that
// wrote it when dir knows it (in the main etcd or another).
func ChooseJournal(dir undo.StateDir, journal string) *Choice {
	owner := dir.RunOfJournal(journal)
	if owner == nil {
		owner, _ = dir.RunOfEtcdJournal(journal)
	}
	return &Choice{Main: EtcdJournals{Specs: []undo.JournalSpec{{Path: journal, Record: owner}}, WayBack: owner}}
}

// ChooseRun is the rollback of run id of dir and every later run, newest
// first: each run's journal in each etcd it wrote to, a run refused or
// stopped before its first write (no journal) passed over. An
// *undo.NotFoundError or *undo.GapError says the runs are not all there; a
// *JournalGoneError that a run that wrote has lost its journal.
func ChooseRun(dir undo.StateDir, id string) (*Choice, error) {
	recs, err := dir.Since(id)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, &undo.NotFoundError{ID: id, StateDir: string(dir)}
	}
	oldest := recs[0]
	slices.Reverse(recs)
	c := &Choice{Main: EtcdJournals{WayBack: &oldest}}
	for i, r := range recs {
		c.Undoes = append(c.Undoes, r.ID)
		if there, err := present(r.Journal); err != nil {
			return nil, fmt.Errorf("run %s: %w", r.ID, err)
		} else if there {
			c.Main.Specs = append(c.Main.Specs, undo.JournalSpec{Path: r.Journal, Record: &recs[i]})
		} else if r.KeysWritten > 0 && len(r.Etcds) == 0 {
			// (A run in several etcds counts the keys of all: its other
			// etcds' journals may hold them.)
			return nil, &JournalGoneError{Run: r.ID, Keys: r.KeysWritten, Journal: r.Journal, Snapshot: r.Snapshot}
		}
		for _, e := range r.Etcds {
			view, _ := r.InEtcd(e.Name)
			j := slices.IndexFunc(c.Others, func(o *EtcdJournals) bool { return o.Name == e.Name })
			if j < 0 {
				c.Others = append(c.Others, &EtcdJournals{Name: e.Name, Endpoints: e.Endpoints})
				j = len(c.Others) - 1
			}
			if there, err := present(view.Journal); err != nil {
				return nil, fmt.Errorf("run %s: %s: %w", r.ID, e.Name, err)
			} else if there {
				c.Others[j].Specs = append(c.Others[j].Specs, undo.JournalSpec{Path: view.Journal, Record: &view})
			}
		}
	}
	for _, o := range c.Others {
		if v, ok := oldest.InEtcd(o.Name); ok {
			o.WayBack = &v
		}
	}
	return c, nil
}

// present says whether a run's journal is on disk (a run refused or stopped
// before its first write there has none).
func present(path string) (bool, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}
