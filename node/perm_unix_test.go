//go:build unix

package node_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/node"
)

// TestDataDirPrivate: under the usual umask 022, everything a node
// writes in its data directory (the store's directory, segments,
// checkpoint, lock, runs, the users file) is readable by its user only:
// files 0600, directories 0700. A data directory left open by an older
// version is made private at start, with a log line.
func TestDataDirPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "data")
	ctx := testutil.Context(t, time.Minute)
	// A small budget makes the deep queue page its index out to runs.
	n, err := node.Start(node.Config{DataDir: dir, Log: quiet(), MemoryBudget: 2 << 20, AdminUser: "admin", AdminPassword: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := n.Connect().Tasks(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 16)
	for i := 0; !hasRun(t, filepath.Join(dir, "store")); i++ {
		if i == 100_000 {
			t.Fatal("no run file after 100,000 tasks under a 2 MiB budget")
		}
		if err := jobs.SubmitAsync(ctx, courier.Task{Body: body}, func(courier.TaskID, error) {}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Broker().Checkpoint(); err != nil {
		t.Fatal(err)
	}
	n.Close() // nothing changes under the walk
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the data dir the node created: %v, %v; want 0700", fi.Mode(), err)
	}
	seen := assertPrivate(t, dir)
	for _, want := range []string{"users.json", "CHECKPOINT", "LOCK", ".seg", ".run"} {
		if !strings.Contains(seen, want) {
			t.Errorf("no %s among the files checked: %s", want, seen)
		}
	}

	// An older version's modes: opened up again, made private at start.
	open := 0
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		mode := os.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		if path != dir {
			os.Chmod(path, mode)
			open++
		}
		return nil
	})
	var buf logBuffer
	n, err = node.Start(node.Config{DataDir: dir, Log: buf.logger(), MemoryBudget: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	assertPrivate(t, dir)
	if !strings.Contains(buf.String(), "were made private") {
		t.Errorf("no log line for the %d files made private:\n%s", open, buf.String())
	}
}

// hasRun reports whether dir holds a run file.
func hasRun(t *testing.T, dir string) bool {
	m, err := filepath.Glob(filepath.Join(dir, "*.run"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m) > 0
}

// assertPrivate fails t for every file or directory under dir (dir
// itself aside, whose mode the operator chose) with group or other
// permissions, and returns the names it checked.
func assertPrivate(t *testing.T, dir string) string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), want)
		}
		names = append(names, d.Name())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(names, " ")
}
