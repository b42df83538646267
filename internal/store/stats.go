package store

import (
	"cmp"
	"slices"
	"sync/atomic"
	"time"
)

// SyncBuckets are the upper bounds of [Stats.SyncHist]'s buckets; the last
// bucket counts the syncs slower than every bound.
var SyncBuckets = [...]time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	time.Second,
}

// Stats are a [Log]'s counters, for metrics. Counters only grow; gauges
// say "now".
type Stats struct {
	Records       uint64 // records appended, release records included
	AppendedBytes uint64 // bytes appended, headers included
	WrittenBytes  uint64 // bytes written to segment files
	Writes        uint64 // write calls
	Syncs         uint64 // sync rounds (one per group commit)
	SyncTime      time.Duration
	SyncMax       time.Duration
	SyncLast      time.Duration
	// SyncHist counts syncs by latency: SyncHist[i] those up to
	// SyncBuckets[i] (and above the previous bound), the last those slower
	// than every bound.
	SyncHist        [len(SyncBuckets) + 1]uint64
	SegmentsCreated uint64
	SegmentsDeleted uint64
	Checkpoints     uint64
	BadReleases     uint64 // releases of unknown or already dead records, ignored
	RunsWritten     uint64 // run files written (see Log.WriteRun)
	RunsDeleted     uint64
	RunBytes        uint64 // bytes written to run files
	// DamagedRecords and DamagedBytes count the records that do not check
	// (a changed byte, a bad sector): those Open reported in
	// Recovery.Corrupt, and those the background check found since (see
	// Options.ScrubRate). Torn tails cut by Open after a crash are not
	// damage. Damaged records stay in place; their messages are lost.
	DamagedRecords int64
	DamagedBytes   int64
	// Scrub is the background check's state: ScrubOff, ScrubRunning or
	// ScrubDone. ScrubBytes is what it verified so far of ScrubTotal, the
	// bytes Open left to it.
	Scrub      string
	ScrubBytes uint64
	ScrubTotal int64

	Segments      int   // segment files
	Runs          int   // live run files
	DiskBytes     int64 // bytes in segment files (appended, not all written yet)
	LiveRecords   int64 // records appended and not released
	LiveBytes     int64 // their size, headers included
	End           Pos   // where the next record goes
	Durable       Pos   // everything before is durable
	CheckpointPos Pos   // the last durable checkpoint's position
	Failed        bool  // the log met a write or sync error; reopen it
	DiskFree      int64 // free space at the last check; -1 if unknown
	DiskAlarm     bool  // DiskFree is below Options.MinFreeDisk (see Log.DiskAlarm)
}

// SyncAvg is the mean sync latency.
func (s Stats) SyncAvg() time.Duration {
	if s.Syncs == 0 {
		return 0
	}
	return s.SyncTime / time.Duration(s.Syncs)
}

// counters are the atomic counters behind [Stats].
type counters struct {
	records, appendedBytes, writtenBytes, writes atomic.Uint64
	syncs, syncNanos, syncMax, syncLast          atomic.Uint64
	syncHist                                     [len(SyncBuckets) + 1]atomic.Uint64
	segmentsCreated, segmentsDeleted             atomic.Uint64
	checkpoints, badReleases                     atomic.Uint64
	runsWritten, runsDeleted, runBytes           atomic.Uint64
	scrubbed                                     atomic.Uint64 // bytes the background check verified
	scrubDone                                    atomic.Bool
	damagedRecords, damagedBytes                 atomic.Int64 // found by Open (Recovery.Corrupt) and the background check
}

func (c *counters) observeSync(d time.Duration) {
	c.syncs.Add(1)
	c.syncNanos.Add(uint64(d))
	c.syncLast.Store(uint64(d))
	for {
		m := c.syncMax.Load()
		if uint64(d) <= m || c.syncMax.CompareAndSwap(m, uint64(d)) {
			break
		}
	}
	i := 0
	for i < len(SyncBuckets) && d > SyncBuckets[i] {
		i++
	}
	c.syncHist[i].Add(1)
}

// Stats returns the log's counters. It walks the segments (hundreds, not
// records), so it is cheap enough for every metrics scrape.
func (l *Log) Stats() Stats {
	c := &l.stats
	s := Stats{
		Records:         c.records.Load(),
		AppendedBytes:   c.appendedBytes.Load(),
		WrittenBytes:    c.writtenBytes.Load(),
		Writes:          c.writes.Load(),
		Syncs:           c.syncs.Load(),
		SyncTime:        time.Duration(c.syncNanos.Load()),
		SyncMax:         time.Duration(c.syncMax.Load()),
		SyncLast:        time.Duration(c.syncLast.Load()),
		SegmentsCreated: c.segmentsCreated.Load(),
		SegmentsDeleted: c.segmentsDeleted.Load(),
		Checkpoints:     c.checkpoints.Load(),
		BadReleases:     c.badReleases.Load(),
		RunsWritten:     c.runsWritten.Load(),
		RunsDeleted:     c.runsDeleted.Load(),
		RunBytes:        c.runBytes.Load(),
		DamagedRecords:  c.damagedRecords.Load(),
		DamagedBytes:    c.damagedBytes.Load(),
		Scrub:           l.scrubState(),
		ScrubBytes:      c.scrubbed.Load(),
		ScrubTotal:      l.scrub.total,
		Durable:         posFromKey(l.durable.Load()),
		DiskFree:        l.diskFree.Load(),
		DiskAlarm:       l.diskAlarm.Load(),
	}
	for i := range s.SyncHist {
		s.SyncHist[i] = c.syncHist[i].Load()
	}
	l.runMu.Lock()
	s.Runs = len(l.runs.live)
	l.runMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, seg := range l.segs {
		s.Segments++
		s.DiskBytes += seg.size
		s.LiveRecords += seg.live
		s.LiveBytes += seg.liveBytes
	}
	s.End = l.next
	s.CheckpointPos = l.ckpt
	s.Failed = l.err != nil && l.err != ErrClosed
	return s
}

// scrubState returns the background check's state.
func (l *Log) scrubState() string {
	switch {
	case l.opts.ScrubRate <= 0:
		return ScrubOff
	case l.stats.scrubDone.Load():
		return ScrubDone
	}
	return ScrubRunning
}

// SegmentInfo describes one segment, for [Log.Segments].
type SegmentInfo struct {
	Num         uint32
	Size        int64 // bytes, header included
	LiveRecords int64
	LiveBytes   int64
	Sealed      bool // no longer appended to
}

// Segments describes every segment, oldest first. A caller that wants to
// reclaim a mostly dead old segment copies its live records forward (read,
// append again, point its index at the new ref, release the old one): the
// store cannot, since only the caller knows which records are live.
func (l *Log) Segments() []SegmentInfo {
	l.mu.Lock()
	out := make([]SegmentInfo, 0, len(l.segs))
	for _, s := range l.segs {
		out = append(out, SegmentInfo{Num: s.num, Size: s.size, LiveRecords: s.live, LiveBytes: s.liveBytes, Sealed: s.sealed})
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b SegmentInfo) int { return cmp.Compare(a.Num, b.Num) })
	return out
}
