package store

import (
	"errors"
	"fmt"
)

// Sentinel errors. Errors returned by the package wrap these with the
// operation and file; check them with [errors.Is].
var (
	// ErrClosed is returned by calls on a [Log] after [Log.Close], and
	// passed to the done callbacks of appends that Close could not flush.
	ErrClosed = errors.New("store: log closed")

	// ErrFailed wraps the first write or fsync error the log met. After it,
	// nothing appended since the last successful sync is confirmed, and
	// every later call fails with it: durability can no longer be
	// promised (the kernel may have dropped the dirty pages), so the caller
	// must Close the log and Open it again, which recovers from disk.
	ErrFailed = errors.New("store: log failed")

	// ErrCorrupt is returned by [Log.Read] and [Log.Replay] when a record's
	// checksum or header does not match, and used in [Recovery] to describe
	// damaged data.
	ErrCorrupt = errors.New("store: corrupt record")

	// ErrNotFound is returned by [Log.Read] for a record whose segment is
	// gone (deleted after release, or lost) or that lies past its end.
	ErrNotFound = errors.New("store: record not found")

	// ErrTooLarge is returned by [Log.Append] for a payload over
	// [Options.MaxRecordSize].
	ErrTooLarge = errors.New("store: record too large")

	// ErrBadKind is returned by [Log.Append] for kind 0 or a kind reserved
	// by the store (see [KindRelease]).
	ErrBadKind = errors.New("store: invalid record kind")

	// ErrLocked is returned by [Open] when another Log (in this or another
	// process) holds the directory; [*LockedError] wraps it and names the
	// process when it is known.
	ErrLocked = errors.New("store: directory locked by another log")

	// ErrBadCheckpoint describes a checkpoint file that cannot be used; it
	// appears in [Recovery.CheckpointErr], never as an Open failure.
	ErrBadCheckpoint = errors.New("store: bad checkpoint")

	// ErrInjected is returned by [MemFS] operations that a test chose to
	// fail.
	ErrInjected = errors.New("store: injected fault")
)

// LockedError is the error of [Open] on a directory whose LOCK another
// process (or another Log of this one) holds. It matches [ErrLocked].
type LockedError struct {
	// Path is the LOCK file.
	Path string
	// PID is the process that holds it, as the LOCK file or the system's
	// lock table tells; 0 when unknown.
	PID int
	// Command is the holder's command line, when the system tells it.
	Command string
}

// Holder describes the process that holds the lock: "process 1234
// (courier server --data d)", or "another process".
func (e *LockedError) Holder() string {
	switch {
	case e.PID == 0:
		return "another process"
	case e.Command == "":
		return fmt.Sprintf("process %d", e.PID)
	}
	return fmt.Sprintf("process %d (%s)", e.PID, e.Command)
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("store: %s holds %s", e.Holder(), e.Path)
}

// Unwrap makes errors.Is(err, ErrLocked) hold.
func (e *LockedError) Unwrap() error { return ErrLocked }
