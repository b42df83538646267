package store

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// Runs are immutable side files that a caller writes whole, reads back in
// pieces and drops when it is done with them: a queue pages the middle of
// its index out to runs (see internal/queue), so that a deep queue keeps
// neither its messages nor their index in memory. The store does not
// look inside a run; it names it, makes it durable at the next
// checkpoint, and deletes it once no durable checkpoint can refer to it.
//
//	<dir>/<queue 8 hex>-<num 8 hex>.run
//
// num counts up across the log and is never reused.
//
// Durability: a run is written without fsync (a queue writes one under
// its lock, and must not wait for the disk there); [Log.Checkpoint]
// syncs every run written since the previous checkpoint before it writes
// the checkpoint file, so a checkpoint whose state names a run finds it
// whole after a crash. A run written after the last checkpoint may be
// torn or lost by a crash; no checkpoint state names it, and the caller
// drops it at restart (see [Log.Runs]).
//
// Deletion: [Log.DropRun] only marks a run dead. Its file is deleted when
// the next checkpoint is durable, since the previous checkpoint's state
// may still name it.

// runKey names a run.
type runKey struct{ queue, num uint32 }

const runSuffix = ".run"

func runName(k runKey) string { return fmt.Sprintf("%08x-%08x%s", k.queue, k.num, runSuffix) }

// parseRunName parses a run file's name.
func parseRunName(name string) (runKey, bool) {
	base, ok := strings.CutSuffix(name, runSuffix)
	if !ok || len(base) != 17 || base[8] != '-' {
		return runKey{}, false
	}
	q, err1 := strconv.ParseUint(base[:8], 16, 32)
	n, err2 := strconv.ParseUint(base[9:], 16, 32)
	if err1 != nil || err2 != nil {
		return runKey{}, false
	}
	return runKey{uint32(q), uint32(n)}, true
}

// runState is the log's record of its runs. Guarded by Log.runMu.
type runState struct {
	next     uint32              // number of the next run
	live     map[runKey]struct{} // written (or found by Open) and not dropped
	unsynced []runKey            // written since the last checkpoint
	dropped  []runKey            // dropped, to delete after the next checkpoint
}

// WriteRun writes data as a new run of queue and returns its number. The
// run is durable once the next [Log.Checkpoint] returns.
func (l *Log) WriteRun(queue uint32, data []byte) (uint32, error) {
	l.runMu.Lock()
	if l.runs.next == 0 {
		l.runMu.Unlock()
		return 0, fmt.Errorf("write run: %w: run numbers exhausted", ErrFailed)
	}
	k := runKey{queue, l.runs.next}
	l.runs.next++
	l.runMu.Unlock()
	if err := l.failure(); err != nil {
		return 0, fmt.Errorf("write run: %w", err)
	}
	name := join(l.dir, runName(k))
	f, err := l.fs.Create(name)
	if err != nil {
		return 0, fmt.Errorf("write run: %w", err)
	}
	_, err = f.WriteAt(data, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		l.fs.Remove(name)
		return 0, fmt.Errorf("write run %s: %w", runName(k), err)
	}
	l.runMu.Lock()
	l.runs.live[k] = struct{}{}
	l.runs.unsynced = append(l.runs.unsynced, k)
	l.runMu.Unlock()
	l.stats.runsWritten.Add(1)
	l.stats.runBytes.Add(uint64(len(data)))
	return k.num, nil
}

// ReadRun reads len(buf) bytes (fewer at the end of the run) of run num
// of queue from offset off into buf, and returns how many it read. It
// returns [ErrNotFound] for a run that does not exist.
func (l *Log) ReadRun(queue, num uint32, off int64, buf []byte) (int, error) {
	k := runKey{queue, num}
	f, err := l.fs.Open(join(l.dir, runName(k)))
	if err != nil {
		return 0, fmt.Errorf("read run %s: %w: %w", runName(k), ErrNotFound, err)
	}
	defer f.Close()
	n, err := f.ReadAt(buf, off)
	if err == io.EOF {
		err = nil
	}
	if err != nil {
		return n, fmt.Errorf("read run %s at %d: %w", runName(k), off, err)
	}
	return n, nil
}

// DropRun declares run num of queue dead; its file is deleted once the
// next checkpoint is durable. Dropping a run that is not live does
// nothing.
func (l *Log) DropRun(queue, num uint32) {
	k := runKey{queue, num}
	l.runMu.Lock()
	defer l.runMu.Unlock()
	if _, ok := l.runs.live[k]; !ok {
		return
	}
	delete(l.runs.live, k)
	if i := slices.Index(l.runs.unsynced, k); i >= 0 {
		l.runs.unsynced = slices.Delete(l.runs.unsynced, i, i+1)
	}
	l.runs.dropped = append(l.runs.dropped, k)
}

// Runs returns the numbers of queue's live runs, in order. After a
// restart, the caller drops those that its checkpoint state does not
// name: they were written after the checkpoint.
func (l *Log) Runs(queue uint32) []uint32 {
	l.runMu.Lock()
	var out []uint32
	for k := range l.runs.live {
		if k.queue == queue {
			out = append(out, k.num)
		}
	}
	l.runMu.Unlock()
	slices.Sort(out)
	return out
}

// DropRuns drops every run of queue, as for a deleted queue.
func (l *Log) DropRuns(queue uint32) {
	for _, n := range l.Runs(queue) {
		l.DropRun(queue, n)
	}
}

// takeDropped returns the runs dropped so far and forgets them: the
// checkpoint about to be taken cannot name them.
func (l *Log) takeDropped() []runKey {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	d := l.runs.dropped
	l.runs.dropped = nil
	return d
}

// giveBackDropped puts back runs taken by takeDropped for a checkpoint
// that failed.
func (l *Log) giveBackDropped(d []runKey) {
	l.runMu.Lock()
	l.runs.dropped = append(d, l.runs.dropped...)
	l.runMu.Unlock()
}

// syncRuns makes the runs written since the last checkpoint durable.
func (l *Log) syncRuns() error {
	l.runMu.Lock()
	todo := l.runs.unsynced
	l.runs.unsynced = nil
	l.runMu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	slices.SortFunc(todo, func(a, b runKey) int { return cmp.Compare(a.num, b.num) })
	for i, k := range todo {
		f, err := l.fs.Open(join(l.dir, runName(k)))
		if err != nil {
			if l.runDropped(k) {
				continue // dropped (and perhaps deleted) meanwhile
			}
			l.requeueUnsynced(todo[i:])
			return fmt.Errorf("sync run %s: %w", runName(k), err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			l.requeueUnsynced(todo[i:])
			return fmt.Errorf("sync run %s: %w", runName(k), err)
		}
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		l.requeueUnsynced(todo)
		return fmt.Errorf("sync runs: %w", err)
	}
	return nil
}

func (l *Log) runDropped(k runKey) bool {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	_, live := l.runs.live[k]
	return !live
}

func (l *Log) requeueUnsynced(ks []runKey) {
	l.runMu.Lock()
	for _, k := range ks {
		if _, live := l.runs.live[k]; live {
			l.runs.unsynced = append(l.runs.unsynced, k)
		}
	}
	l.runMu.Unlock()
}

// deleteRuns deletes the files of dead runs.
func (l *Log) deleteRuns(ks []runKey) {
	for _, k := range ks {
		if err := l.fs.Remove(join(l.dir, runName(k))); err != nil {
			l.opts.Logger.Warn("store: cannot delete dead run", "dir", l.dir, "run", runName(k), "err", err)
			continue
		}
		l.stats.runsDeleted.Add(1)
	}
}
