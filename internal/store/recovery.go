package store

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"time"
)

// Recovery reports what [Open] found and did, for the caller to act on
// and log. Damage never makes Open fail: it is cut off or stepped over,
// and reported here.
type Recovery struct {
	// State is the caller's state from the last checkpoint, nil without
	// one.
	State []byte
	// From is that checkpoint's position: [Log.Replay] starts there. Zero
	// without a checkpoint: Replay then covers the whole log.
	From Pos
	// CheckpointErr says why a checkpoint file that exists was not used
	// (it wraps [ErrBadCheckpoint] or an I/O error). Replay then starts at
	// the oldest segment left, and the caller must rebuild its state from
	// the records alone; records whose segments were already deleted are
	// dead, but releases in those segments are lost, so some released
	// records may come back (at-least-once).
	CheckpointErr error
	// End is where appends continue.
	End Pos
	// Segments is the number of segment files kept.
	Segments int
	// Runs is the number of run files found (see [Log.Runs]).
	Runs int
	// ReplayRecords and ReplayBytes measure what Replay will read: the
	// work of this restart, proportional to what was written since the
	// checkpoint.
	ReplayRecords int64
	ReplayBytes   int64
	// Truncated lists the tails cut off, each truncated (or, if even its
	// header was bad, deleted): anything wrong at the end of the last
	// segment, and a record cut short at the end of an earlier segment
	// (several segments can be written in one round before it is synced).
	// Appends go to a new segment after a cut, so no position is ever
	// reused. Nothing confirmed is ever in a torn tail, unless the disk
	// lost synced data.
	Truncated []Damage
	// Corrupt lists other damage: a bad record in the middle of a sealed
	// segment, or a segment shorter than the checkpoint says. It is kept
	// in place, skipped by Replay, and fails Read with [ErrCorrupt] or
	// [ErrNotFound]. It means the disk lost or changed synced data.
	Corrupt []Damage
	// DroppedBytes and DroppedRecords total Truncated and Corrupt.
	DroppedBytes   int64
	DroppedRecords int64
	// Missing lists segments that the checkpoint says hold live records
	// but that are gone.
	Missing []uint32
	// Removed counts dead segments deleted by Open (their deletion was
	// due when the previous process stopped).
	Removed int
	// Duration is how long Open took.
	Duration time.Duration
}

// Damage is one stretch of bad data found by [Open].
type Damage struct {
	Seg     uint32
	Off     int64 // where the bad data starts
	Bytes   int64 // from Off to the end of the segment file
	Records int64 // records lost, best effort: the bad one and those after it that still check
	Err     error // what was wrong
}

// Clean reports whether Open found no damage of any kind.
func (r *Recovery) Clean() bool {
	return r.CheckpointErr == nil && len(r.Truncated) == 0 && len(r.Corrupt) == 0 && len(r.Missing) == 0
}

// LogValue implements [slog.LogValuer]: log a Recovery as one attribute.
func (r *Recovery) LogValue() slog.Value {
	attrs := []slog.Attr{
		slog.String("from", r.From.String()),
		slog.String("end", r.End.String()),
		slog.Int("segments", r.Segments),
		slog.Int64("replay_records", r.ReplayRecords),
		slog.Int64("replay_bytes", r.ReplayBytes),
		slog.Duration("duration", r.Duration),
	}
	if r.DroppedBytes > 0 || r.DroppedRecords > 0 {
		attrs = append(attrs, slog.Int64("dropped_bytes", r.DroppedBytes), slog.Int64("dropped_records", r.DroppedRecords))
	}
	for _, d := range r.Truncated {
		attrs = append(attrs, slog.String("truncated", d.String()))
	}
	for _, d := range r.Corrupt {
		attrs = append(attrs, slog.String("corrupt", d.String()))
	}
	if len(r.Missing) > 0 {
		attrs = append(attrs, slog.Any("missing_segments", r.Missing))
	}
	if r.CheckpointErr != nil {
		attrs = append(attrs, slog.String("checkpoint_err", r.CheckpointErr.Error()))
	}
	if r.Removed > 0 {
		attrs = append(attrs, slog.Int("removed_segments", r.Removed))
	}
	return slog.GroupValue(attrs...)
}

func (d Damage) String() string {
	return fmt.Sprintf("%s at %d: %d bytes, ~%d records: %v", segName(d.Seg), d.Off, d.Bytes, d.Records, d.Err)
}

// Open opens the log in dir, creating it if needed, and recovers it: it
// reads the last checkpoint, verifies every record written after it (the
// work is proportional to that, not to the log's size), cuts off a torn
// or corrupt tail, rebuilds the segments' live counts, and deletes
// segments that were due for deletion. The returned [Recovery] says what
// it found; [Log.Replay] then hands the caller the records after the
// checkpoint.
//
// Open fails only on bad options, I/O errors, or a directory that
// another Log holds ([ErrLocked]); never on damaged data.
func Open(fs FS, dir string, opts Options) (*Log, *Recovery, error) {
	opts.ensureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, nil, err
	}
	start := opts.now()
	if err := fs.MkdirAll(dir); err != nil {
		return nil, nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	l := &Log{
		fs:    fs,
		dir:   dir,
		opts:  opts,
		pend:  &batch{},
		free:  &batch{},
		segs:  map[uint32]*segState{},
		work:  make(chan struct{}, 1),
		kick:  make(chan struct{}, 1),
		gc:    make(chan struct{}, 1),
		stop:  make(chan struct{}),
		sfree: &syncJob{},
		runs:  runState{next: 1, live: map[runKey]struct{}{}},
	}
	l.space.L = &l.mu
	l.scond.L = &l.smu
	ch := make(chan struct{})
	l.progress.Store(&ch)
	dch := make(chan struct{})
	l.drained.Store(&dch)
	l.files.Store(&fileTable{})
	if lk, ok := fs.(Locker); ok {
		c, err := lk.Lock(join(dir, lockName))
		if err != nil {
			return nil, nil, fmt.Errorf("store: open %s: %w", dir, err)
		}
		l.lock = c
	}
	rec, err := l.recover()
	if err != nil {
		for _, f := range *l.files.Load() {
			f.Close()
		}
		if l.lock != nil {
			l.lock.Close()
		}
		return nil, nil, fmt.Errorf("store: open %s: %w", dir, err)
	}
	l.checkDisk()
	rec.Duration = opts.now().Sub(start)
	l.wg.Add(2)
	go l.runWriter()
	go l.runSyncer()
	l.jwg.Add(1)
	go l.runJanitor()
	if opts.ScrubRate > 0 {
		l.jwg.Add(1)
		go l.runScrub()
	}
	return l, rec, nil
}

// recover rebuilds the log's state from dir; see Open.
func (l *Log) recover() (*Recovery, error) {
	names, err := listSorted(l.fs, l.dir)
	if err != nil {
		return nil, err
	}
	rec := &Recovery{}
	var nums []uint32
	hasCkpt := false
	for _, name := range names {
		switch {
		case name == checkpointName:
			hasCkpt = true
		case name == checkpointTemp:
			// A checkpoint that was being written: the previous one stands.
			if err := l.fs.Remove(join(l.dir, name)); err != nil {
				return nil, err
			}
		default:
			if n, ok := parseSegName(name); ok {
				nums = append(nums, n)
			} else if k, ok := parseRunName(name); ok {
				l.runs.live[k] = struct{}{}
				l.runs.next = max(l.runs.next, k.num+1)
			}
		}
	}

	var ck *checkpoint
	if hasCkpt {
		ck, err = readCheckpoint(l.fs, join(l.dir, checkpointName))
		if err != nil {
			rec.CheckpointErr = fmt.Errorf("%s: %w", checkpointName, err)
			ck = nil
		}
	}
	var from Pos
	table := map[uint32]segCount{}
	if ck != nil {
		from = ck.at
		rec.State, rec.From = ck.state, ck.at
		l.ckpt = ck.at
		for _, s := range ck.segs {
			table[s.seg] = s
		}
	}

	files := fileTable{}
	defer func() { l.files.Store(&files) }()
	open := func(num uint32) (File, int64, error) {
		f, err := l.fs.Open(join(l.dir, segName(num)))
		if err != nil {
			return nil, 0, err
		}
		size, err := f.Size()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		files[num] = f
		return f, size, nil
	}
	remove := func(num uint32) error {
		if f := files[num]; f != nil {
			f.Close()
			delete(files, num)
		}
		return l.fs.Remove(join(l.dir, segName(num)))
	}
	damage := func(list *[]Damage, d Damage) {
		*list = append(*list, d)
		rec.DroppedBytes += d.Bytes
		rec.DroppedRecords += d.Records
	}
	dirChanged := false

	// Segments before the checkpoint's: their counts come from the
	// checkpoint; they are not read.
	var scan []uint32
	maxSeen := uint32(0)
	for _, num := range nums {
		maxSeen = max(maxSeen, num)
		if num >= from.Seg {
			scan = append(scan, num)
			continue
		}
		t, ok := table[num]
		if !ok || t.live == 0 {
			// Dead when the checkpoint was taken (or deleted before it and
			// back after a crash): its deletion was due.
			if err := remove(num); err != nil {
				return nil, err
			}
			rec.Removed++
			dirChanged = true
			continue
		}
		f, size, err := open(num)
		if err != nil {
			return nil, err
		}
		herr, err := readSegHeader(f, num)
		if err != nil {
			return nil, err
		}
		if herr != nil {
			damage(&rec.Corrupt, Damage{Seg: num, Bytes: size, Records: t.live, Err: herr})
		} else {
			l.scrub.add(num, segHeaderSize, size)
		}
		l.segs[num] = &segState{num: num, size: size, live: t.live, liveBytes: t.liveBytes, sealed: true}
	}
	// Segments the checkpoint counts but that are gone: tracked until the
	// tail is applied, which may release their records.
	ghosts := map[uint32]bool{}
	for num, t := range table {
		if _, ok := l.segs[num]; !ok && num < from.Seg && t.live > 0 && !slices.Contains(nums, num) {
			ghosts[num] = true
			l.segs[num] = &segState{num: num, size: math.MaxInt64, live: t.live, liveBytes: t.liveBytes, sealed: true}
		}
	}

	// The checkpoint's segment and later ones: verify every record.
	newSeg := false // appends must start a new segment
	var releases []Ref
	for i, num := range scan {
		last := i == len(scan)-1
		f, size, err := open(num)
		if err != nil {
			return nil, err
		}
		s := &segState{num: num, sealed: !last}
		start := int64(segHeaderSize)
		durableTo := int64(0) // before this, data is known durable (the checkpoint covers it)
		if num == from.Seg {
			if t, ok := table[num]; ok {
				s.live, s.liveBytes = t.live, t.liveBytes
			}
			start = max(start, int64(from.Off))
			durableTo = int64(from.Off)
		}
		herr, err := readSegHeader(f, num)
		if err != nil {
			return nil, err
		}
		if herr != nil {
			d := Damage{Seg: num, Bytes: size, Records: countFrom(f, num, segHeaderSize, size), Err: herr}
			if (last || size < segHeaderSize) && durableTo <= segHeaderSize {
				// Its header never reached the disk, so neither did anything
				// after it: a segment started in the round of writes that
				// the crash cut (the last, or, if the file ends inside its
				// header, an earlier one of that round). An empty file is a
				// clean end; a partial header is reported.
				if err := remove(num); err != nil {
					return nil, err
				}
				dirChanged = true
				newSeg = newSeg || last
				if size > 0 {
					damage(&rec.Truncated, d)
				}
				continue
			}
			damage(&rec.Corrupt, d)
			s.size, s.sealed = size, true
			l.segs[num] = s
			newSeg = newSeg || last
			continue
		}
		if start > size {
			damage(&rec.Corrupt, Damage{Seg: num, Off: size, Err: fmt.Errorf("%w: segment ends at %d, before the checkpoint position %v", ErrCorrupt, size, from)})
			s.size, s.sealed = size, true
			l.segs[num] = s
			newSeg = newSeg || last
			continue
		}
		l.segs[num] = s
		if num == from.Seg {
			l.scrub.add(num, segHeaderSize, start) // up to the checkpoint: verified by the background check
		}
		s.size = start
		sc := &scanner{f: f, seg: num, off: start, end: size}
		for {
			r, err := sc.next()
			if err == io.EOF {
				break
			}
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					return nil, err
				}
				d := Damage{Seg: num, Off: sc.off, Bytes: size - sc.off, Records: countFrom(f, num, sc.off, size), Err: err}
				if last || errors.Is(err, errTorn) {
					// A torn end: of the last segment, or of one written in
					// the same unsynced round as the next (a sealed segment
					// is synced with the next one, not before it is
					// started). Cut it; a cut last segment gets no more
					// appends, so no position is used twice.
					if err := f.Truncate(sc.off); err != nil {
						return nil, fmt.Errorf("truncate %s: %w", segName(num), err)
					}
					damage(&rec.Truncated, d)
					newSeg = newSeg || last
					size = sc.off
				} else {
					damage(&rec.Corrupt, d)
				}
				break
			}
			rec.ReplayRecords++
			rec.ReplayBytes += r.Size()
			s.size = sc.off
			if r.Kind != KindRelease {
				s.live++
				s.liveBytes += r.Size()
				continue
			}
			releases, _ = r.Released(releases[:0])
			for _, ref := range releases {
				// A release of a record that is not there (lost in a torn
				// round, in a segment now gone) changes nothing.
				t := l.segs[ref.Seg]
				if t == nil || t.live <= 0 || int64(ref.Off)+ref.Size() > t.size {
					l.stats.badReleases.Add(1)
					continue
				}
				t.live--
				t.liveBytes -= ref.Size()
			}
		}
		s.size = sc.off
		if sc.off < size && !last {
			s.size = size
		}
		l.replay = append(l.replay, segRange{seg: num, from: start, to: sc.off})
		// What the previous process wrote may still be only in the page
		// cache; make it durable before anything is built on it.
		if err := f.Sync(); err != nil {
			return nil, fmt.Errorf("sync %s: %w", segName(num), err)
		}
	}

	for num := range ghosts {
		if l.segs[num].live > 0 {
			rec.Missing = append(rec.Missing, num)
		}
		delete(l.segs, num)
	}
	slices.Sort(rec.Missing)

	// Delete what the checkpoint and the tail say is dead.
	for num, s := range l.segs {
		if num < from.Seg && s.live == 0 {
			if err := remove(num); err != nil {
				return nil, err
			}
			delete(l.segs, num)
			rec.Removed++
			dirChanged = true
		}
	}
	if dirChanged {
		if err := l.fs.SyncDir(l.dir); err != nil {
			return nil, err
		}
	}

	// Where appends continue.
	l.nextSeg = max(maxSeen+1, from.Seg, 1)
	end := Pos{}
	if n := len(scan); n > 0 {
		if s := l.segs[scan[n-1]]; s != nil {
			end = Pos{Seg: s.num, Off: uint32(s.size)}
			if !newSeg && !s.sealed && s.size+recHeaderSize < l.opts.SegmentSize {
				l.active = s
				l.next = end
				l.wseg, l.wfile = s.num, files[s.num]
			} else {
				s.sealed = true
			}
		}
	}
	if end == (Pos{}) {
		for _, s := range l.segs {
			if p := (Pos{Seg: s.num, Off: uint32(s.size)}); end.Less(p) {
				end = p
			}
		}
	}
	l.appended.Store(end.key())
	l.written.Store(end.key())
	l.durable.Store(end.key())
	rec.End = l.next
	if l.active == nil {
		rec.End = Pos{Seg: l.nextSeg, Off: segHeaderSize}
	}
	rec.Segments = len(l.segs)
	rec.Runs = len(l.runs.live)
	for _, d := range rec.Corrupt {
		l.stats.damagedRecords.Add(d.Records)
		l.stats.damagedBytes.Add(d.Bytes)
	}
	return rec, nil
}

// readSegHeader reads and checks the header of segment num. It returns
// damage (wrapping ErrCorrupt) apart from I/O errors.
func readSegHeader(f File, num uint32) (damage, err error) {
	var h [segHeaderSize]byte
	n, err := f.ReadAt(h[:], 0)
	if n < len(h) && err != nil && err != io.EOF {
		return nil, fmt.Errorf("read %s: %w", segName(num), err)
	}
	return checkSegHeader(h[:n], num), nil
}
