package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Log is a durable, segmented, append-only log shared by many queues. See
// the package doc for the model; all methods are safe for concurrent use.
type Log struct {
	fs   FS
	dir  string
	opts Options
	lock io.Closer // directory lock, if the FS has one

	mu      sync.Mutex           // guards the fields below, up to the blank line, and every segState
	space   sync.Cond            // on mu: pend drained, or the log failed or closed
	pend    *batch               // appended, not yet taken by the writer
	free    *batch               // the writer's spare batch, nil while it writes
	next    Pos                  // position of the next record; Off 0 until a segment is started
	nextSeg uint32               // number of the next segment to start
	active  *segState            // the segment appends go to; nil before the first
	segs    map[uint32]*segState // every live segment, on disk or about to be
	ckpt    Pos                  // position of the last durable checkpoint
	err     error                // sticky: wraps ErrFailed, or is ErrClosed
	closing bool                 // Close was called
	replay  []segRange           // what Replay reads, fixed by Open

	filesMu sync.Mutex                // serializes writers of files
	files   atomic.Pointer[fileTable] // segment files, copy on write, for readers

	appended atomic.Uint64                 // Pos.key of next: the end of what was appended
	written  atomic.Uint64                 // Pos.key just past the bytes handed to the kernel
	durable  atomic.Uint64                 // Pos.key just past the bytes known durable
	progress atomic.Pointer[chan struct{}] // closed and replaced when written moves or the log fails
	drained  atomic.Pointer[chan struct{}] // closed and replaced when the writer takes the pending batch, or the log fails or closes

	runMu sync.Mutex // guards runs; never held with another lock
	runs  runState

	scrub scrubPlan // the background check's work, fixed by Open

	diskAlarm atomic.Bool  // free space below Options.MinFreeDisk
	diskFree  atomic.Int64 // at the last check; -1 if unknown

	work   chan struct{} // wakes the writer; capacity 1
	wantGC atomic.Bool   // a segment may have become deletable

	// Owned by the writer goroutine.
	wseg  uint32
	wfile File

	smu     sync.Mutex     // guards job, sfree, sdone
	scond   sync.Cond      // on smu: a job is ready or the writer is done
	job     *syncJob       // written, waiting for the syncer
	sfree   *syncJob       // the syncer's spare job
	sdone   bool           // the writer has exited; the syncer exits when job is nil
	kick    chan struct{}  // makes the syncer stop waiting for the interval; capacity 1
	gc      chan struct{}  // wakes the janitor; capacity 1
	stop    chan struct{}  // closed by Close after the writer and syncer exit
	ckptMu  sync.Mutex     // serializes Checkpoint
	wg      sync.WaitGroup // the writer and the syncer
	jwg     sync.WaitGroup // the janitor
	stats   counters
	closeMu sync.Mutex // serializes Close
	closed  bool       // guarded by closeMu
}

// segState is the accounting of one segment. Guarded by Log.mu.
type segState struct {
	num       uint32
	size      int64 // bytes assigned (header and records)
	live      int64 // records appended and not released (release records are never live)
	liveBytes int64
	zeroAt    Pos  // the release record that brought live to 0; deletable once durable
	sealed    bool // a later segment has been started
}

// segRange is a stretch of a segment that Replay reads.
type segRange struct {
	seg      uint32
	from, to int64
}

// fileTable maps segment numbers to open files. It is never modified
// once published; writers copy it.
type fileTable map[uint32]File

// batch is what appenders fill while the writer writes the previous one.
type batch struct {
	chunks []chunk       // bytes to write, in log order, at most one per segment
	dones  []func(error) // callbacks, in log order
	bytes  int           // bytes in chunks
	force  bool          // sync without waiting for the interval
}

// chunk is a run of bytes for one segment file.
type chunk struct {
	seg uint32
	off int64 // where buf[0] goes in the file
	buf []byte
}

func (b *batch) empty() bool { return len(b.chunks) == 0 && len(b.dones) == 0 }

// reset empties b, keeping its buffers.
func (b *batch) reset() {
	clear(b.dones)
	b.dones = b.dones[:0]
	b.chunks = b.chunks[:0]
	b.bytes = 0
	b.force = false
}

// tail returns the chunk that bytes at pos go into.
func (b *batch) tail(pos Pos) *chunk {
	if n := len(b.chunks); n > 0 {
		c := &b.chunks[n-1]
		if c.seg == pos.Seg && c.off+int64(len(c.buf)) == int64(pos.Off) {
			return c
		}
	}
	if len(b.chunks) < cap(b.chunks) {
		b.chunks = b.chunks[:len(b.chunks)+1]
	} else {
		b.chunks = append(b.chunks, chunk{})
	}
	c := &b.chunks[len(b.chunks)-1]
	c.seg, c.off, c.buf = pos.Seg, int64(pos.Off), c.buf[:0]
	return c
}

// syncJob is written data waiting for a sync, with the callbacks it
// confirms.
type syncJob struct {
	files   []File
	dones   []func(error) // confirmed by the sync
	end     uint64        // Pos.key the sync makes durable
	failed  []func(error) // after dones: appended after the log failed
	failErr error         // what failed gets
	force   bool
}

func (j *syncJob) reset() {
	clear(j.files)
	j.files = j.files[:0]
	clear(j.dones)
	j.dones = j.dones[:0]
	clear(j.failed)
	j.failed = j.failed[:0]
	j.failErr = nil
	j.force = false
}

// Append adds a record for queue to the log and returns where it is. The
// record is not yet durable: done, if not nil, is called once it is
// (per [Options.Sync]) with nil, or with an error wrapping [ErrFailed] or
// [ErrClosed] if it may not be. Until done(nil), the caller must not tell
// anyone the record is safe; it may already [Log.Read] it.
//
// Append blocks while [Options.MaxPending] bytes wait to be written. If it
// returns an error, the record was not appended and done is not called.
//
// done is called from the log's sync goroutine, in append order (a
// failure never overtakes an earlier confirm). It must
// not block for long: every later confirm waits for it. It may call
// Append, Release and Read, but not [Log.Sync], [Log.Checkpoint] or
// [Log.Close], which wait for that goroutine.
func (l *Log) Append(queue uint32, kind Kind, payload []byte, done func(error)) (Ref, error) {
	if kind == 0 || kind >= KindReserved {
		return Ref{}, fmt.Errorf("append kind %d: %w", kind, ErrBadKind)
	}
	if len(payload) > l.opts.MaxRecordSize {
		return Ref{}, fmt.Errorf("append %d bytes: %w (max %d)", len(payload), ErrTooLarge, l.opts.MaxRecordSize)
	}
	var h [recHeaderSize]byte
	putRecordHeader(h[:], queue, kind, payload)
	pos, err := l.add(h[:], payload, done, nil, true)
	return Ref{Pos: pos, Len: uint32(len(payload))}, err
}

// AppendNoWait is [Log.Append] without the wait for flow control: it
// never blocks, whatever is pending. A caller that holds a lock others
// need (a queue's) waits with [Log.WaitSpace] first, without the lock,
// then appends with AppendNoWait under it; the bytes pending can then
// pass MaxPending by what the callers that passed WaitSpace together
// append, which their number bounds.
func (l *Log) AppendNoWait(queue uint32, kind Kind, payload []byte, done func(error)) (Ref, error) {
	if kind == 0 || kind >= KindReserved {
		return Ref{}, fmt.Errorf("append kind %d: %w", kind, ErrBadKind)
	}
	if len(payload) > l.opts.MaxRecordSize {
		return Ref{}, fmt.Errorf("append %d bytes: %w (max %d)", len(payload), ErrTooLarge, l.opts.MaxRecordSize)
	}
	var h [recHeaderSize]byte
	putRecordHeader(h[:], queue, kind, payload)
	pos, err := l.add(h[:], payload, done, nil, false)
	return Ref{Pos: pos, Len: uint32(len(payload))}, err
}

// WaitSpace blocks while [Options.MaxPending] bytes wait to be written,
// until ctx ends, or the log fails or closes (it returns that error). It
// is the flow control of [Log.Append], taken apart so that a publisher
// can wait for it without holding a lock that consumers need (see
// [Log.AppendNoWait]).
func (l *Log) WaitSpace(ctx context.Context) error {
	for {
		ch := l.drained.Load()
		l.mu.Lock()
		full := l.pend.bytes >= l.opts.MaxPending && l.pend.bytes > 0
		err := l.err
		if err == nil && l.closing {
			err = ErrClosed
		}
		l.mu.Unlock()
		if err != nil {
			return err
		}
		if !full {
			return nil
		}
		select {
		case <-*ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// AppendSync is [Log.Append] that waits until the record is durable.
func (l *Log) AppendSync(queue uint32, kind Kind, payload []byte) (Ref, error) {
	ch := make(chan error, 1)
	ref, err := l.Append(queue, kind, payload, func(err error) { ch <- err })
	if err != nil {
		return ref, err
	}
	return ref, <-ch
}

// Release declares the records refs dead: their queue is done with them
// (acked, expired, moved) and will never read them again, even after a
// crash. It appends a [KindRelease] record listing them, so that recovery
// knows too, and updates the segments' live counts; a segment whose
// records are all released is deleted once a checkpoint covers it (see
// the package doc). Each ref must be released once, with the Len that
// Append returned.
//
// done, if not nil, is called as for Append once the release is durable.
// Release never blocks for flow control: acks must not wait behind
// publishers, and releases are bounded by the appends they release.
func (l *Log) Release(queue uint32, refs []Ref, done func(error)) error {
	per := max(l.opts.MaxRecordSize/releaseEntrySize, 1)
	var buf []byte
	for len(refs) > 0 {
		n := min(len(refs), per)
		buf = buf[:0]
		for _, r := range refs[:n] {
			buf = appendReleaseEntry(buf, r)
		}
		var h [recHeaderSize]byte
		putRecordHeader(h[:], queue, KindRelease, buf)
		var d func(error)
		if n == len(refs) {
			d = done
		}
		if _, err := l.add(h[:], buf, d, refs[:n], false); err != nil {
			return err
		}
		refs = refs[n:]
	}
	return nil
}

// add appends one encoded record (header h, payload) and, for a release
// record, applies the releases to the accounting under the same lock, so
// that a checkpoint's cut sees both or neither. wait makes it wait while
// MaxPending bytes are pending.
func (l *Log) add(h, payload []byte, done func(error), released []Ref, wait bool) (Pos, error) {
	size := int64(len(h) + len(payload))
	l.mu.Lock()
	for wait && l.err == nil && !l.closing && l.pend.bytes >= l.opts.MaxPending && l.pend.bytes > 0 {
		l.space.Wait()
	}
	if l.err != nil || l.closing {
		err := l.err
		if err == nil {
			err = ErrClosed
		}
		l.mu.Unlock()
		return Pos{}, err
	}
	if l.active == nil || int64(l.next.Off)+size > l.opts.SegmentSize {
		if l.nextSeg == 0 || l.nextSeg == math.MaxUint32 {
			l.mu.Unlock()
			return Pos{}, fmt.Errorf("%w: segment numbers exhausted", ErrFailed)
		}
		l.roll()
	}
	pos := l.next
	c := l.pend.tail(pos)
	c.buf = append(c.buf, h...)
	c.buf = append(c.buf, payload...)
	l.next.Off += uint32(size)
	l.appended.Store(l.next.key())
	s := l.active
	s.size = int64(l.next.Off)
	l.pend.bytes += int(size)
	if done != nil {
		l.pend.dones = append(l.pend.dones, done)
	}
	if released == nil {
		s.live++
		s.liveBytes += size
	} else {
		for _, r := range released {
			l.releaseLocked(r, pos)
		}
	}
	l.mu.Unlock()
	l.stats.records.Add(1)
	l.stats.appendedBytes.Add(uint64(size))
	l.wake()
	return pos, nil
}

// releaseLocked takes r out of its segment's live count; at is the
// position of the release record. l.mu is held.
func (l *Log) releaseLocked(r Ref, at Pos) {
	s := l.segs[r.Seg]
	if s == nil || s.live <= 0 || r.end().key() > l.next.key() {
		l.stats.badReleases.Add(1)
		return
	}
	s.live--
	s.liveBytes -= r.Size()
	if s.live == 0 {
		s.zeroAt = at
		if s.sealed {
			l.wantGC.Store(true)
		}
	}
}

// roll seals the active segment and starts the next one; its header goes
// into the pending batch. l.mu is held.
func (l *Log) roll() {
	if a := l.active; a != nil {
		a.sealed = true
		if a.live == 0 {
			l.wantGC.Store(true)
		}
	}
	s := &segState{num: l.nextSeg, size: segHeaderSize}
	l.nextSeg++
	l.segs[s.num] = s
	l.active = s
	c := l.pend.tail(Pos{Seg: s.num})
	c.buf = appendSegHeader(c.buf, s.num)
	l.pend.bytes += segHeaderSize
	l.next = Pos{Seg: s.num, Off: segHeaderSize}
}

// wake makes sure the writer looks at the pending batch.
func (l *Log) wake() {
	select {
	case l.work <- struct{}{}:
	default:
	}
}

// Sync waits until everything appended before the call is durable, even
// under the [Interval] policy.
func (l *Log) Sync() error {
	ch := make(chan error, 1)
	l.mu.Lock()
	if l.err != nil || l.closing {
		err := l.err
		if err == nil {
			err = ErrClosed
		}
		l.mu.Unlock()
		return err
	}
	l.pend.dones = append(l.pend.dones, func(err error) { ch <- err })
	l.pend.force = true
	l.mu.Unlock()
	l.wake()
	return <-ch
}

// Read reads the record ref, which [Log.Append] returned, into buf (grown
// if too small) and verifies its checksum; the record's Payload aliases
// buf. It is safe concurrently with appends, and waits if the record is
// still being handed to the kernel. A released record may be gone:
// [ErrNotFound].
func (l *Log) Read(ref Ref, buf []byte) (Record, error) {
	end := ref.end().key()
	if end > l.appended.Load() {
		return Record{}, fmt.Errorf("read %v: %w: past the end of the log", ref.Pos, ErrNotFound)
	}
	if err := l.waitWritten(end); err != nil {
		return Record{}, fmt.Errorf("read %v: %w", ref.Pos, err)
	}
	f := (*l.files.Load())[ref.Seg]
	if f == nil {
		return Record{}, fmt.Errorf("read %v: %w: no segment %d", ref.Pos, ErrNotFound, ref.Seg)
	}
	n := int(ref.Size())
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	m, err := f.ReadAt(buf, int64(ref.Off))
	if m < n {
		if err == io.EOF || err == nil || errors.Is(err, os.ErrClosed) {
			return Record{}, fmt.Errorf("read %v: %w: past the end of segment %d", ref.Pos, ErrNotFound, ref.Seg)
		}
		return Record{}, fmt.Errorf("read %v in %s: %w", ref.Pos, segName(ref.Seg), err)
	}
	return checkRecord(buf, ref.Pos)
}

// waitWritten waits until the bytes before end have been handed to the
// kernel.
func (l *Log) waitWritten(end uint64) error {
	for {
		ch := l.progress.Load()
		if l.written.Load() >= end {
			return nil
		}
		l.mu.Lock()
		err := l.err
		l.mu.Unlock()
		if err != nil {
			return err
		}
		<-*ch
	}
}

// notify wakes readers waiting in waitWritten.
func (l *Log) notify() {
	ch := make(chan struct{})
	close(*l.progress.Swap(&ch))
}

// fail records the log's first failure and wakes everyone who waits.
func (l *Log) fail(err error) {
	l.mu.Lock()
	first := l.err == nil
	if first {
		l.err = fmt.Errorf("%w: %w", ErrFailed, err)
	}
	l.mu.Unlock()
	if first {
		l.opts.Logger.Error("store: log failed; appends refused until reopened", "dir", l.dir, "err", err)
	}
	l.space.Broadcast()
	l.notify()
	l.notifyDrained()
}

// notifyDrained wakes callers waiting in WaitSpace.
func (l *Log) notifyDrained() {
	ch := make(chan struct{})
	close(*l.drained.Swap(&ch))
}

// failure returns the log's sticky error, if any.
func (l *Log) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// addFile publishes f as the file of segment seg; f nil removes it.
func (l *Log) addFile(seg uint32, f File) {
	l.filesMu.Lock()
	defer l.filesMu.Unlock()
	old := *l.files.Load()
	t := make(fileTable, len(old)+1)
	for k, v := range old {
		t[k] = v
	}
	if f == nil {
		delete(t, seg)
	} else {
		t[seg] = f
	}
	l.files.Store(&t)
}

// Close flushes and syncs what was appended, calls the outstanding done
// callbacks, stops the log's goroutines and closes its files. It returns
// the log's failure, if it had one. Calls after Close fail with
// [ErrClosed].
func (l *Log) Close() error {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.closed = true
	l.mu.Lock()
	l.closing = true
	l.mu.Unlock()
	l.space.Broadcast()
	l.notifyDrained()
	l.wake()
	l.wg.Wait()
	close(l.stop)
	l.jwg.Wait()
	l.ckptMu.Lock() // no checkpoint is half written when the lock goes
	defer l.ckptMu.Unlock()
	l.mu.Lock()
	err := l.err
	l.err = ErrClosed
	l.mu.Unlock()
	l.notify()
	for _, f := range *l.files.Load() {
		f.Close()
	}
	if l.lock != nil {
		l.lock.Close()
	}
	return err
}

// now is the options' clock.
func (l *Log) now() time.Time { return l.opts.now() }
