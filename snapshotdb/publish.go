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

// CheckOutput refuses an output path that would overwrite the input, or an
// existing file without force, before any work is done.
func CheckOutput(in, out string, force bool) error {
	if out == "" {
		return input.Errorf("%s: no file given", input.OutputSnapshot)
	}
	ofi, err := os.Stat(out)
	switch {
	case err == nil:
		if ifi, ierr := os.Stat(in); ierr == nil && os.SameFile(ifi, ofi) {
			return input.Errorf("%s %s is the %s itself, which is never modified: write elsewhere", input.OutputSnapshot, out, input.SnapshotFile)
		}
		if !ofi.Mode().IsRegular() {
			return input.Errorf("%s %s: not a regular file", input.OutputSnapshot, out)
		}
		if !force {
			return input.Errorf("%s %s exists: remove it or pass %s to replace it", input.OutputSnapshot, out, input.Force)
		}
	case !errors.Is(err, os.ErrNotExist):
		return input.Errorf("%s %s: %w", input.OutputSnapshot, out, err)
	}
	dir := filepath.Dir(out)
	f, err := os.CreateTemp(dir, "."+filepath.Base(out)+".probe-*")
	if err != nil {
		return input.Errorf("%s %s: cannot write in %s: %w", input.OutputSnapshot, out, dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}
