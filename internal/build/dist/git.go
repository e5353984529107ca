package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// repo is the git repository a release is built from.
type repo struct{ dir string }

func (r repo) git(args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", r.dir}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimRight(string(out), "\n"), nil
}

// commit is the full hash rev names, if it names a commit.
func (r repo) commit(rev string) (string, bool) {
	out, err := r.git("rev-parse", "--verify", "--quiet", rev+"^{commit}")
	return out, err == nil && out != ""
}

// show is the file at path in rev.
func (r repo) show(rev, path string) (string, error) {
	return r.git("show", rev+":"+path)
}

// commitTime is the commit's committer time, in UTC.
func (r repo) commitTime(hash string) (time.Time, error) {
	out, err := r.git("show", "-s", "--format=%ct", hash)
	if err != nil {
		return time.Time{}, err
	}
	sec, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time of %s: %q", hash, out)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// extract writes the tree of commit hash into dir, as git archive gives it:
// the commit exactly, whatever the working tree holds.
func (r repo) extract(hash, dir string) error {
	cmd := exec.Command("git", "-C", r.dir, "archive", "--format=tar", hash)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	terr := untar(out, dir)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %v: %s", hash, err, strings.TrimSpace(stderr.String()))
	}
	return terr
}

// untar writes a tar stream of regular files, directories and symlinks under
// dir; a name that would leave dir is refused.
func untar(in io.Reader, dir string) error {
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, ".."+string(filepath.Separator)) {
			return fmt.Errorf("archive entry %q leaves the tree", h.Name)
		}
		path := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o755|0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, path); err != nil {
				return err
			}
		case tar.TypeXGlobalHeader:
			// git archive's pax header: the commit id
		default:
			return fmt.Errorf("archive entry %q: unexpected type %c", h.Name, h.Typeflag)
		}
	}
}
