package store

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestLockedNamesHolder: a second Open of a directory names the process
// that holds it, from the PID in the LOCK file and, on Linux, from the
// system's lock table when the file has none.
func TestLockedNamesHolder(t *testing.T) {
	dir := t.TempDir()
	l, _ := mustOpen(t, OSFS{}, dir, smallOptions())
	defer mustClose(t, l)
	lock := filepath.Join(dir, lockName)
	b, err := os.ReadFile(lock)
	if err != nil || strings.TrimSpace(string(b)) != itoa(os.Getpid()) {
		t.Fatalf("LOCK holds %q (%v), want the PID %d", b, err, os.Getpid())
	}
	check := func(how string) {
		t.Helper()
		_, _, err := Open(OSFS{}, dir, smallOptions())
		var le *LockedError
		if !errors.As(err, &le) || !errors.Is(err, ErrLocked) {
			t.Fatalf("%s: second open: %v, want a *LockedError", how, err)
		}
		if le.PID != os.Getpid() || le.Path != lock {
			t.Errorf("%s: %+v, want PID %d and path %s", how, le, os.Getpid(), lock)
		}
		if want := "process " + itoa(os.Getpid()); !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q lacks %q", how, err, want)
		}
		if runtime.GOOS == "linux" && !strings.Contains(le.Command, filepath.Base(os.Args[0])) {
			t.Errorf("%s: command %q, want the test binary's", how, le.Command)
		}
	}
	check("PID in the file")
	if runtime.GOOS != "linux" {
		return
	}
	// A LOCK file without a PID (written by an older version): the lock
	// table names the holder.
	if err := os.WriteFile(lock, nil, FileMode); err != nil {
		t.Fatal(err)
	}
	check("lock table")
}

func itoa(n int) string { return strconv.Itoa(n) }
