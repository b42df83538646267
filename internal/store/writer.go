package store

import (
	"fmt"
	"slices"
	"time"
)

// The write path has three goroutines:
//
//   - the writer takes the pending batch (everything appended since it
//     last looked), writes it with one pwrite per segment touched, and
//     hands the written range to the syncer; it starts segment files;
//   - the syncer syncs what was written (every file touched) and calls
//     the done callbacks. While it syncs, the writer writes the next
//     batch and appenders fill the one after: many appends share one
//     sync (group commit), and writing overlaps syncing;
//   - the janitor deletes dead segments, off the append path.
//
// Appenders and the writer meet on Log.mu; the writer and the syncer on
// Log.smu. Lock order: ckptMu -> mu -> filesMu; smu is never held with
// another lock.

// runWriter is the writer goroutine.
func (l *Log) runWriter() {
	defer l.wg.Done()
	var touched []File
	for range l.work {
		for {
			l.mu.Lock()
			if l.pend.empty() {
				closing := l.closing
				l.mu.Unlock()
				if closing {
					l.endSyncer()
					return
				}
				break
			}
			b := l.pend
			l.pend, l.free = l.free, nil
			failed := l.err
			l.mu.Unlock()
			l.space.Broadcast()
			l.notifyDrained()
			touched = l.writeBatch(b, failed, touched[:0])
			b.reset()
			l.mu.Lock()
			l.free = b
			l.mu.Unlock()
		}
	}
}

// writeBatch writes b and hands it to the syncer; if the log has failed,
// it hands over b's callbacks to be failed instead, so that every callback
// runs on the syncer, in log order. touched is scratch space for the files
// written.
func (l *Log) writeBatch(b *batch, failed error, touched []File) []File {
	if failed == nil {
		for i := range b.chunks {
			c := &b.chunks[i]
			if c.seg != l.wseg {
				if c.off != 0 {
					l.fail(fmt.Errorf("internal error: segment %d continues at %d but the writer is in segment %d", c.seg, c.off, l.wseg))
					break
				}
				f, err := l.createSegment(c.seg)
				if err != nil {
					l.fail(err)
					break
				}
				l.wseg, l.wfile = c.seg, f
			}
			if _, err := l.wfile.WriteAt(c.buf, c.off); err != nil {
				l.fail(fmt.Errorf("write %s at %d: %w", segName(c.seg), c.off, err))
				break
			}
			if !slices.Contains(touched, l.wfile) {
				touched = append(touched, l.wfile)
			}
			l.written.Store(Pos{Seg: c.seg, Off: uint32(c.off) + uint32(len(c.buf))}.key())
			l.stats.writes.Add(1)
			l.stats.writtenBytes.Add(uint64(len(c.buf)))
		}
		l.notify()
		failed = l.failure()
	}

	l.smu.Lock()
	j := l.job
	if j == nil {
		j, l.sfree = l.sfree, nil
		if j == nil {
			j = &syncJob{}
		}
		l.job = j
	}
	if failed != nil {
		// Everything from here on fails; what came before is synced (or
		// fails) as the syncer finds.
		j.failed = append(j.failed, b.dones...)
		if j.failErr == nil {
			j.failErr = failed
		}
	} else {
		for _, f := range touched {
			if !slices.Contains(j.files, f) {
				j.files = append(j.files, f)
			}
		}
		j.dones = append(j.dones, b.dones...)
		j.end = l.written.Load()
	}
	j.force = j.force || b.force || failed != nil
	l.smu.Unlock()
	l.scond.Signal()
	if b.force || failed != nil {
		l.kickSyncer()
	}
	return touched
}

// createSegment creates the file of segment seg and makes its name
// durable before anything in it is confirmed.
func (l *Log) createSegment(seg uint32) (File, error) {
	name := join(l.dir, segName(seg))
	f, err := l.fs.Create(name)
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		f.Close()
		return nil, fmt.Errorf("sync dir after creating %s: %w", segName(seg), err)
	}
	l.addFile(seg, f)
	l.stats.segmentsCreated.Add(1)
	l.checkDisk()
	return f, nil
}

// endSyncer tells the syncer that nothing more comes: it syncs what is
// left at once and exits.
func (l *Log) endSyncer() {
	l.smu.Lock()
	l.sdone = true
	l.smu.Unlock()
	l.scond.Signal()
	l.kickSyncer()
}

func (l *Log) kickSyncer() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// runSyncer is the syncer goroutine.
func (l *Log) runSyncer() {
	defer l.wg.Done()
	var (
		lastSync time.Time
		timer    *time.Timer
		broken   error // after a failed sync, nothing is confirmed again
	)
	for {
		l.smu.Lock()
		for l.job == nil && !l.sdone {
			l.scond.Wait()
		}
		j := l.job
		if j == nil {
			l.smu.Unlock()
			return
		}
		if l.opts.Sync == Interval && !j.force && !l.sdone && broken == nil {
			if wait := lastSync.Add(l.opts.SyncInterval).Sub(l.now()); wait > 0 {
				l.smu.Unlock()
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-timer.C:
				case <-l.kick:
					timer.Stop()
				}
				continue
			}
		}
		l.job = nil
		l.smu.Unlock()

		err := broken
		if err == nil && len(j.files) > 0 {
			start := time.Now()
			for _, f := range j.files {
				if err = f.Sync(); err != nil {
					break
				}
			}
			l.stats.observeSync(time.Since(start))
			lastSync = l.now()
			if err != nil {
				l.fail(fmt.Errorf("sync: %w", err))
				broken = l.failure()
				err = broken
			}
		}
		if err == nil && j.end > l.durable.Load() { // a job of failures only has no end
			l.durable.Store(j.end)
		}
		for _, d := range j.dones {
			d(err)
		}
		for _, d := range j.failed {
			d(j.failErr)
		}
		if err == nil && l.wantGC.Load() {
			l.signalGC()
		}
		j.reset()
		l.smu.Lock()
		l.sfree = j
		l.smu.Unlock()
	}
}

func (l *Log) signalGC() {
	select {
	case l.gc <- struct{}{}:
	default:
	}
}

// runJanitor is the janitor goroutine: it deletes dead segments when told
// one may be.
func (l *Log) runJanitor() {
	defer l.jwg.Done()
	tick, stop := l.diskTicker()
	defer stop()
	for {
		select {
		case <-l.stop:
			return
		case <-l.gc:
			l.collect()
		case <-tick:
			l.checkDisk()
		}
	}
}

// collect deletes every segment that is dead: sealed, below the last
// durable checkpoint, with no live record, and whose last release is
// durable. See the package doc for why each condition is needed.
func (l *Log) collect() {
	l.wantGC.Store(false)
	durable := l.durable.Load()
	var dead []uint32
	l.mu.Lock()
	for num, s := range l.segs {
		if !s.sealed || num >= l.ckpt.Seg || s.live != 0 {
			continue
		}
		if s.zeroAt.key() >= durable {
			l.wantGC.Store(true) // again after the next sync
			continue
		}
		dead = append(dead, num)
		delete(l.segs, num)
	}
	l.mu.Unlock()
	slices.Sort(dead)
	for _, num := range dead {
		l.removeSegment(num)
	}
}

// removeSegment closes and deletes the file of a segment already taken
// out of the accounting. A failed removal leaves a file that the next
// Open deletes (no checkpoint lists it).
func (l *Log) removeSegment(num uint32) {
	f := (*l.files.Load())[num]
	l.addFile(num, nil)
	if f != nil {
		f.Close()
	}
	if err := l.fs.Remove(join(l.dir, segName(num))); err != nil {
		l.opts.Logger.Warn("store: cannot delete dead segment", "dir", l.dir, "segment", segName(num), "err", err)
		return
	}
	l.stats.segmentsDeleted.Add(1)
	l.opts.Logger.Debug("store: deleted dead segment", "dir", l.dir, "segment", segName(num))
}
