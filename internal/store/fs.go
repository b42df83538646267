package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// FS is the file system a [Log] lives on: [OSFS] in production, [MemFS]
// in tests. Paths are slash-separated and absolute or relative to the
// process's working directory. Methods may be called from any goroutine.
//
// The log holds every queued message: files and directories it creates
// must be readable by the process's user only (OSFS: [FileMode] and
// [DirMode]).
type FS interface {
	// Create creates or truncates the file name, open for reading and
	// writing.
	Create(name string) (File, error)
	// Open opens the existing file name for reading and writing.
	Open(name string) (File, error)
	// Remove deletes the file name.
	Remove(name string) error
	// Rename atomically replaces newname with oldname.
	Rename(oldname, newname string) error
	// List returns the names of the entries in dir, in any order.
	List(dir string) ([]string, error)
	// MkdirAll creates dir and its parents if missing.
	MkdirAll(dir string) error
	// SyncDir makes creations, renames and removals in dir durable.
	SyncDir(dir string) error
}

// File is an open file of an [FS]. ReadAt may be called concurrently with
// every other method; the Log never writes one file from two goroutines.
type File interface {
	io.ReaderAt
	io.WriterAt
	io.Closer
	// Sync makes the file's written data durable (fdatasync(2) on
	// Linux: the data, and the size when it grew).
	Sync() error
	// Truncate cuts or extends the file to size bytes.
	Truncate(size int64) error
	// Size returns the file's current size.
	Size() (int64, error)
}

// Locker is an optional interface of an [FS] that can lock a directory
// against a second [Log], in this or another process. [Open] uses it when
// the FS has it.
type Locker interface {
	// Lock takes an exclusive lock on the file name, creating it if
	// needed, and returns [ErrLocked] if it is already held. Closing the
	// returned Closer releases the lock.
	Lock(name string) (io.Closer, error)
}

// Spacer is an optional interface of an [FS] that tells how much space is
// left on the disk that holds a directory; the log's disk alarm uses it
// (see [Options.MinFreeDisk]).
type Spacer interface {
	// FreeSpace returns the bytes available to the process on the file
	// system of dir.
	FreeSpace(dir string) (int64, error)
}

// FileMode and DirMode are the permissions of the files and directories
// OSFS creates: the owner's only, whatever the umask, since segments,
// runs and checkpoints hold every queued message.
const (
	FileMode os.FileMode = 0o600
	DirMode  os.FileMode = 0o700
)

// OSFS is the operating system's file system.
type OSFS struct{}

var (
	_ FS     = OSFS{}
	_ Locker = OSFS{}
	_ Spacer = OSFS{}
	_ File   = (*osFile)(nil)
)

// Create implements [FS].
func (OSFS) Create(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_TRUNC, FileMode)
	if err != nil {
		return nil, err
	}
	return &osFile{f}, nil
}

// Open implements [FS].
func (OSFS) Open(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	return &osFile{f}, nil
}

// Remove implements [FS].
func (OSFS) Remove(name string) error { return os.Remove(name) }

// Rename implements [FS].
func (OSFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// List implements [FS].
func (OSFS) List(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

// MkdirAll implements [FS].
func (OSFS) MkdirAll(dir string) error { return os.MkdirAll(dir, DirMode) }

// SyncDir implements [FS].
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// FreeSpace implements [Spacer] with statfs(2) where the platform has
// it.
func (OSFS) FreeSpace(dir string) (int64, error) { return freeSpace(dir) }

// Lock implements [Locker] with flock(2).
func (OSFS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, FileMode)
	if err != nil {
		return nil, err
	}
	if err := flock(f); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, lockedBy(f, name)
		}
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	// The holder's PID, for a second process to name it.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// osFile is an [os.File] whose Sync is fdatasync where the platform has
// it.
type osFile struct{ *os.File }

func (f *osFile) Sync() error { return datasync(f.File) }

func (f *osFile) Size() (int64, error) {
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// listSorted lists dir and sorts the names.
func listSorted(fs FS, dir string) ([]string, error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// join joins a directory and a file name.
func join(dir, name string) string { return filepath.Join(dir, name) }
