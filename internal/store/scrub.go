package store

import (
	"errors"
	"io"
	"os"
	"time"
)

// The background check ("scrub"). Open verifies every record that a
// restart replays: those after the last checkpoint. The rest of the log,
// the segments before the checkpoint's and its own segment up to its
// position, it only trusts: reading it all would make a restart as slow
// as the log is large. A disk that changed data after it was synced
// (a flipped bit, a bad sector) would then show only when a queue reads
// the record back.
//
// So Open starts a goroutine that reads that rest once, oldest segment
// first, at most Options.ScrubRate bytes a second, and verifies every
// record's checksum. What does not check is logged at once (the first
// scrubLogMax stretches of a pass, then a summary), counted in
// Stats.DamagedRecords and Stats.DamagedBytes with the damage Open found,
// and left in place: the records of a damaged segment that check still
// read, and a damaged record fails Log.Read with ErrCorrupt as before.
// Records appended after Open are not checked: they were just written,
// and the next start checks them.

// scrubChunk is how many bytes the scrub verifies between two looks at
// its pace.
const scrubChunk = 1 << 20

// scrubLogMax bounds the damage lines one pass logs one by one.
const scrubLogMax = 16

// Scrub states, for Stats.Scrub.
const (
	ScrubOff     = "off"     // Options.ScrubRate is 0
	ScrubRunning = "running" // the check is reading the log
	ScrubDone    = "done"    // every record Open did not verify was checked once
)

// scrubPlan is what the scrub reads: what Open did not verify, fixed
// before the scrub starts.
type scrubPlan struct {
	todo  []segRange
	total int64 // bytes in todo
}

// add plans the check of bytes from to to of segment seg.
func (p *scrubPlan) add(seg uint32, from, to int64) {
	if to > from {
		p.todo = append(p.todo, segRange{seg: seg, from: from, to: to})
		p.total += to - from
	}
}

// runScrub is the scrub goroutine; see above.
func (l *Log) runScrub() {
	defer l.jwg.Done()
	if l.scrub.total == 0 {
		l.stats.scrubDone.Store(true)
		return
	}
	start := time.Now()
	var verified, paced, records int64
	var found scrubFound
	var buf []byte
	for _, r := range l.scrub.todo {
		f := (*l.files.Load())[r.seg]
		if f == nil {
			continue // deleted since Open
		}
		sc := &scanner{f: f, seg: r.seg, off: r.from, end: r.to, buf: buf[:0]}
		for {
			before := sc.off
			_, err := sc.next()
			if err == io.EOF {
				break
			}
			more := true
			if err != nil {
				more = l.scrubDamage(sc, err, &found)
			} else {
				records++
			}
			verified += sc.off - before
			l.stats.scrubbed.Add(uint64(sc.off - before))
			if !more {
				break
			}
			if verified-paced >= scrubChunk {
				paced = verified
				if !l.scrubPace(start, verified) {
					return
				}
			}
		}
		buf = sc.buf
	}
	l.stats.scrubDone.Store(true)
	attrs := []any{"dir", l.dir, "bytes", verified, "intact_records", records, "duration", time.Since(start).Round(time.Millisecond)}
	if found.records == 0 {
		l.opts.Logger.Info("store: background check done: every record checks", attrs...)
		return
	}
	l.opts.Logger.Error("store: background check done: damaged records found; the disk changed data it had synced",
		append(attrs, "damaged_records", found.records, "damaged_bytes", found.bytes, "stretches", found.stretches)...)
}

// scrubFound totals what one pass found.
type scrubFound struct{ records, bytes, stretches int64 }

// scrubDamage records the damage the scanner sc met (err), steps over
// the bad record when its length can be trusted (else over the rest of
// the segment), and reports whether the scan of the segment can go on. An error that is not damage (an I/O
// error, or the segment deleted meanwhile) ends the segment's scan.
func (l *Log) scrubDamage(sc *scanner, err error, found *scrubFound) bool {
	if !errors.Is(err, ErrCorrupt) {
		if !errors.Is(err, os.ErrClosed) {
			l.opts.Logger.Warn("store: background check cannot read a segment; skipping it", "dir", l.dir, "segment", segName(sc.seg), "err", err)
		}
		return false
	}
	d := Damage{Seg: sc.seg, Off: sc.off, Err: err}
	next := int64(-1)
	if h, perr := sc.peek(int(min(recHeaderSize, sc.end-sc.off))); perr == nil && len(h) == recHeaderSize {
		if n, ok := headerLen(h); ok && recHeaderSize+int64(n) <= sc.end-sc.off {
			// The header is sound and its length fits: the payload (or
			// the checksum) changed. The next record follows it.
			next = sc.off + recHeaderSize + int64(n)
		}
	}
	if next >= 0 {
		d.Bytes, d.Records = next-sc.off, 1
	} else {
		d.Bytes, d.Records = sc.end-sc.off, countFrom(sc.f, sc.seg, sc.off, sc.end)
	}
	found.records += d.Records
	found.bytes += d.Bytes
	found.stretches++
	l.stats.damagedRecords.Add(d.Records)
	l.stats.damagedBytes.Add(d.Bytes)
	if found.stretches <= scrubLogMax {
		l.opts.Logger.Error("store: background check found a damaged record", "dir", l.dir, "damage", d.String())
	}
	if next < 0 {
		sc.off = sc.end // checked, as far as it can be
		return false
	}
	sc.off = next
	return true
}

// scrubPace waits until verified bytes are due at Options.ScrubRate since
// start. It returns false when the log closes.
func (l *Log) scrubPace(start time.Time, verified int64) bool {
	due := start.Add(time.Duration(float64(verified) / float64(l.opts.ScrubRate) * float64(time.Second)))
	wait := time.Until(due)
	if wait <= 0 {
		select {
		case <-l.stop:
			return false
		default:
			return true
		}
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-l.stop:
		return false
	case <-t.C:
		return true
	}
}
