package store

import (
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// Op names a file system operation, for [MemFS.SetInjector].
type Op uint8

// Operations of an [FS] and its [File]s.
const (
	OpCreate Op = iota + 1
	OpOpen
	OpRemove
	OpRename
	OpList
	OpSyncDir
	OpRead
	OpWrite
	OpSync
	OpTruncate
)

var opNames = [...]string{
	OpCreate: "create", OpOpen: "open", OpRemove: "remove", OpRename: "rename", OpList: "list",
	OpSyncDir: "syncdir", OpRead: "read", OpWrite: "write", OpSync: "sync", OpTruncate: "truncate",
}

func (o Op) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// MemFS is an in-memory [FS] that remembers what a power cut would keep,
// for crash tests: file data becomes durable on [File.Sync], and
// creations, renames and removals on [FS.SyncDir] of their directory.
// [MemFS.Crash] returns the disk as a restart would find it. Faults are
// injected with [MemFS.SetInjector] (errors, torn writes) and
// [MemFS.SetSyncLies] (a Sync that reports success but keeps nothing).
//
// The zero MemFS is not usable; call [NewMemFS]. All methods are safe for
// concurrent use.
type MemFS struct {
	mu       sync.Mutex          // guards everything below and every memNode
	files    map[string]*memNode // names visible now
	durable  map[string]*memNode // names a crash keeps
	dirs     map[string]bool     // directories (always durable)
	locks    map[string]bool     // names locked through Lock
	inject   func(Op, string) error
	syncLies bool
	free     int64 // what FreeSpace reports; see SetFreeSpace
}

// memNode is a file's contents: what reads see, and what a crash keeps.
type memNode struct {
	data      []byte
	synced    []byte
	dirtyFrom int // lowest offset changed since the last Sync
}

var (
	_ FS     = (*MemFS)(nil)
	_ Locker = (*MemFS)(nil)
	_ Spacer = (*MemFS)(nil)
	_ File   = (*memFile)(nil)
)

// NewMemFS returns an empty in-memory file system.
func NewMemFS() *MemFS {
	return &MemFS{
		files:   map[string]*memNode{},
		durable: map[string]*memNode{},
		dirs:    map[string]bool{"/": true, ".": true},
		locks:   map[string]bool{},
		free:    math.MaxInt64,
	}
}

// SetFreeSpace sets what [MemFS.FreeSpace] reports, for tests of the
// disk alarm. Default: [math.MaxInt64].
func (fs *MemFS) SetFreeSpace(n int64) {
	fs.mu.Lock()
	fs.free = n
	fs.mu.Unlock()
}

// FreeSpace implements [Spacer]: the value set by SetFreeSpace.
func (fs *MemFS) FreeSpace(string) (int64, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.free, nil
}

// SetInjector installs fn, called before every operation with the
// operation and the file's path; an error it returns is returned by the
// operation instead of doing it, except for writes, which then write the
// first half of their bytes (a torn write). A nil fn removes the
// injector. fn is called with the MemFS's lock held and must not call
// back into it.
func (fs *MemFS) SetInjector(fn func(op Op, name string) error) {
	fs.mu.Lock()
	fs.inject = fn
	fs.mu.Unlock()
}

// SetSyncLies makes [File.Sync] report success without making anything
// durable, as a disk with a volatile write cache and no barriers does.
func (fs *MemFS) SetSyncLies(lie bool) {
	fs.mu.Lock()
	fs.syncLies = lie
	fs.mu.Unlock()
}

// Crash returns the file system as it would be found after a power cut
// now: durable names with their synced data. keep, if not nil, chooses
// how many bytes of a file's unsynced appended tail also reached the disk
// (0 to unsynced); a file changed other than by appending keeps only its
// synced data. The receiver is unchanged and may go on being used (as the
// process that "crashed"), independently of the result.
func (fs *MemFS) Crash(keep func(name string, unsynced int) int) *MemFS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	out := NewMemFS()
	maps.Copy(out.dirs, fs.dirs)
	for name, n := range fs.durable {
		data := append([]byte(nil), n.synced...)
		if keep != nil && n.dirtyFrom >= len(n.synced) && len(n.data) > len(n.synced) {
			tail := n.data[len(n.synced):]
			k := min(max(keep(name, len(tail)), 0), len(tail))
			data = append(data, tail[:k]...)
		}
		nn := &memNode{data: data, synced: append([]byte(nil), data...), dirtyFrom: len(data)}
		out.files[name] = nn
		out.durable[name] = nn
	}
	return out
}

// ReadFile returns a copy of the current contents of name.
func (fs *MemFS) ReadFile(name string) ([]byte, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n, ok := fs.files[filepath.Clean(name)]
	if !ok {
		return nil, &os.PathError{Op: "read", Path: name, Err: os.ErrNotExist}
	}
	return append([]byte(nil), n.data...), nil
}

// WriteFile replaces the contents of name with data, creating it, and
// makes the result durable at once: for tests that damage or plant files.
func (fs *MemFS) WriteFile(name string, data []byte) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	name = filepath.Clean(name)
	n := &memNode{data: append([]byte(nil), data...), synced: append([]byte(nil), data...), dirtyFrom: len(data)}
	fs.files[name] = n
	fs.durable[name] = n
}

func (fs *MemFS) fault(op Op, name string) error {
	if fs.inject == nil {
		return nil
	}
	if err := fs.inject(op, name); err != nil {
		return &os.PathError{Op: op.String(), Path: name, Err: err}
	}
	return nil
}

func (fs *MemFS) checkDir(op Op, name string) error {
	if !fs.dirs[filepath.Dir(name)] {
		return &os.PathError{Op: op.String(), Path: name, Err: os.ErrNotExist}
	}
	return nil
}

// Create implements [FS].
func (fs *MemFS) Create(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	name = filepath.Clean(name)
	if err := fs.fault(OpCreate, name); err != nil {
		return nil, err
	}
	if err := fs.checkDir(OpCreate, name); err != nil {
		return nil, err
	}
	n, ok := fs.files[name]
	if ok {
		n.data = n.data[:0]
		n.dirtyFrom = 0
	} else {
		n = &memNode{}
		fs.files[name] = n
	}
	return &memFile{fs: fs, name: name, n: n}, nil
}

// Open implements [FS].
func (fs *MemFS) Open(name string) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	name = filepath.Clean(name)
	if err := fs.fault(OpOpen, name); err != nil {
		return nil, err
	}
	n, ok := fs.files[name]
	if !ok {
		return nil, &os.PathError{Op: "open", Path: name, Err: os.ErrNotExist}
	}
	return &memFile{fs: fs, name: name, n: n}, nil
}

// Remove implements [FS].
func (fs *MemFS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	name = filepath.Clean(name)
	if err := fs.fault(OpRemove, name); err != nil {
		return err
	}
	if _, ok := fs.files[name]; !ok {
		return &os.PathError{Op: "remove", Path: name, Err: os.ErrNotExist}
	}
	delete(fs.files, name)
	return nil
}

// Rename implements [FS].
func (fs *MemFS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	oldname, newname = filepath.Clean(oldname), filepath.Clean(newname)
	if err := fs.fault(OpRename, newname); err != nil {
		return err
	}
	n, ok := fs.files[oldname]
	if !ok {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: os.ErrNotExist}
	}
	if err := fs.checkDir(OpRename, newname); err != nil {
		return err
	}
	delete(fs.files, oldname)
	fs.files[newname] = n
	return nil
}

// List implements [FS].
func (fs *MemFS) List(dir string) ([]string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir = filepath.Clean(dir)
	if err := fs.fault(OpList, dir); err != nil {
		return nil, err
	}
	if !fs.dirs[dir] {
		return nil, &os.PathError{Op: "list", Path: dir, Err: os.ErrNotExist}
	}
	var names []string
	for name := range fs.files {
		if filepath.Dir(name) == dir {
			names = append(names, filepath.Base(name))
		}
	}
	for d := range fs.dirs {
		if d != dir && filepath.Dir(d) == dir {
			names = append(names, filepath.Base(d))
		}
	}
	return names, nil
}

// MkdirAll implements [FS]. Directories are durable at once.
func (fs *MemFS) MkdirAll(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for d := filepath.Clean(dir); !fs.dirs[d]; d = filepath.Dir(d) {
		if _, ok := fs.files[d]; ok {
			return &os.PathError{Op: "mkdir", Path: d, Err: os.ErrExist}
		}
		fs.dirs[d] = true
	}
	return nil
}

// SyncDir implements [FS]: the names in dir become what a crash keeps.
func (fs *MemFS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	dir = filepath.Clean(dir)
	if err := fs.fault(OpSyncDir, dir); err != nil {
		return err
	}
	if fs.syncLies {
		return nil
	}
	for name := range fs.durable {
		if filepath.Dir(name) == dir {
			delete(fs.durable, name)
		}
	}
	for name, n := range fs.files {
		if filepath.Dir(name) == dir {
			fs.durable[name] = n
		}
	}
	return nil
}

// Lock implements [Locker]. Locks do not survive [MemFS.Crash].
func (fs *MemFS) Lock(name string) (io.Closer, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	name = filepath.Clean(name)
	if fs.locks[name] {
		return nil, fmt.Errorf("%w: %s", ErrLocked, name)
	}
	fs.locks[name] = true
	return memLock{fs, name}, nil
}

type memLock struct {
	fs   *MemFS
	name string
}

func (l memLock) Close() error {
	l.fs.mu.Lock()
	delete(l.fs.locks, l.name)
	l.fs.mu.Unlock()
	return nil
}

// memFile is an open file of a [MemFS]. Like a Unix file descriptor, it
// keeps reaching its data after the name is removed.
type memFile struct {
	fs     *MemFS
	name   string
	n      *memNode
	closed bool // guarded by fs.mu
}

func (f *memFile) op(op Op) error {
	if f.closed {
		return &os.PathError{Op: op.String(), Path: f.name, Err: os.ErrClosed}
	}
	return f.fs.fault(op, f.name)
}

func (f *memFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.op(OpRead); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, &os.PathError{Op: "read", Path: f.name, Err: os.ErrInvalid}
	}
	if off >= int64(len(f.n.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	err := f.op(OpWrite)
	if err != nil && f.closed {
		return 0, err
	}
	if off < 0 {
		return 0, &os.PathError{Op: "write", Path: f.name, Err: os.ErrInvalid}
	}
	if err != nil {
		p = p[:len(p)/2] // a torn write: part of it reached the file
	}
	end := int(off) + len(p)
	if end > len(f.n.data) {
		f.n.data = append(f.n.data, make([]byte, end-len(f.n.data))...)
	}
	copy(f.n.data[off:], p)
	f.n.dirtyFrom = min(f.n.dirtyFrom, int(off))
	if err != nil {
		return len(p), err
	}
	return len(p), nil
}

func (f *memFile) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.op(OpSync); err != nil {
		return err
	}
	if f.fs.syncLies {
		return nil
	}
	n := f.n
	from := min(n.dirtyFrom, len(n.data), len(n.synced))
	n.synced = append(n.synced[:from], n.data[from:]...)
	n.dirtyFrom = len(n.data)
	return nil
}

func (f *memFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.op(OpTruncate); err != nil {
		return err
	}
	if size < 0 {
		return &os.PathError{Op: "truncate", Path: f.name, Err: os.ErrInvalid}
	}
	if int(size) <= len(f.n.data) {
		f.n.data = f.n.data[:size]
	} else {
		f.n.data = append(f.n.data, make([]byte, int(size)-len(f.n.data))...)
	}
	f.n.dirtyFrom = min(f.n.dirtyFrom, int(size))
	return nil
}

func (f *memFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return 0, &os.PathError{Op: "stat", Path: f.name, Err: os.ErrClosed}
	}
	return int64(len(f.n.data)), nil
}

func (f *memFile) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.closed {
		return &os.PathError{Op: "close", Path: f.name, Err: os.ErrClosed}
	}
	f.closed = true
	return nil
}

// String describes the file system's files, for test failures.
func (fs *MemFS) String() string {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var b strings.Builder
	for name, n := range fs.files {
		_, durable := fs.durable[name]
		fmt.Fprintf(&b, "%s: %d bytes, %d synced, durable name %v\n", name, len(n.data), len(n.synced), durable)
	}
	return b.String()
}
