package snapshotdb

import (
	"errors"
	"os"
	"path/filepath"

	"kube-etcd-migrate/internal/input"
)

// Publish moves the complete file tmp to out: a rename (replacing out) with
// force, otherwise a hard link, which fails if out exists.
func Publish(tmp, out string, force bool) error {
	if force {
		if err := os.Rename(tmp, out); err != nil {
			return err
		}
	} else if err := os.Link(tmp, out); err != nil {
		if errors.Is(err, os.ErrExist) {
			return input.Errorf("created by someone else meanwhile: not replaced (%s replaces it)", input.Force)
		}
		// A file system without hard links: rename if out is still absent.
		if _, serr := os.Lstat(out); !errors.Is(serr, os.ErrNotExist) {
			return err
		}
		if err := os.Rename(tmp, out); err != nil {
			return err
		}
	}
	if d, err := os.Open(filepath.Dir(out)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
