package store

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
)

// lockedBy returns the error of a LOCK file f (at name) that another
// process holds, naming that process: from the PID the holder wrote in
// the file or, failing that, from the system's lock table.
func lockedBy(f *os.File, name string) error {
	e := &LockedError{Path: name, PID: pidInLockFile(f)}
	if e.PID == 0 {
		e.PID = lockHolder(f)
	}
	if e.PID != 0 {
		e.Command = processCommand(e.PID)
	}
	return e
}

// pidInLockFile reads the PID a holder wrote in its LOCK file; 0 when
// there is none.
func pidInLockFile(f *os.File) int {
	var b [24]byte
	n, _ := f.ReadAt(b[:], 0)
	line, _, _ := bytes.Cut(b[:n], []byte("\n"))
	pid, err := strconv.Atoi(string(bytes.TrimSpace(line)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// processCommand returns the command line of process pid, shortened,
// or "" when the system does not tell (not Linux, or another user's
// process that /proc hides).
func processCommand(pid int) string {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	defer f.Close()
	const most = 200
	b, _ := io.ReadAll(io.LimitReader(f, most+1))
	s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if len(s) > most {
		s = s[:most] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
