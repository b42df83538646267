package node

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/store"
)

// storeDirName is the store's directory in the data directory.
const storeDirName = "store"

// prepareDataDir creates the data directory, readable by the node's user
// only, and takes group and other permissions away from what the node
// keeps there (the store directory and its files, the users file) if an
// older version or an operator left them open: the store holds every
// queued message. It logs what it changed. It never changes the mode of
// the data directory itself, which the operator chose (it may be a
// shared directory), nor follows symbolic links.
func prepareDataDir(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, store.DirMode); err != nil {
		return fmt.Errorf("node: data dir: %w", err)
	}
	var t tightener
	t.fix(filepath.Join(dir, auth.FileName))
	sd := filepath.Join(dir, storeDirName)
	if t.fix(sd) {
		entries, err := os.ReadDir(sd)
		if err != nil {
			t.errs = append(t.errs, err)
		}
		for _, e := range entries {
			t.fix(filepath.Join(sd, e.Name()))
		}
	}
	if t.changed > 0 {
		log.Warn("data directory: files and directories other users could read were made private (0600 files, 0700 directories)",
			"dir", dir, "changed", t.changed, "example", t.example, "was", t.was.String())
	}
	if err := errors.Join(t.errs...); err != nil {
		log.Warn("data directory: could not make every file private", "dir", dir, "err", err)
	}
	return nil
}

// tightener takes group and other permissions away from files and
// directories, counting what it changed.
type tightener struct {
	changed int
	example string
	was     fs.FileMode
	errs    []error
}

// fix makes path private if it is a regular file or a directory, and
// reports whether it is a directory.
func (t *tightener) fix(path string) (isDir bool) {
	fi, err := os.Lstat(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			t.errs = append(t.errs, err)
		}
		return false
	}
	if !fi.Mode().IsRegular() && !fi.IsDir() {
		return false // a symbolic link, a socket...: not followed, not changed
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		if err := os.Chmod(path, perm&^0o077); err != nil {
			t.errs = append(t.errs, err)
		} else {
			if t.changed == 0 {
				t.example, t.was = path, perm
			}
			t.changed++
		}
	}
	return fi.IsDir()
}
