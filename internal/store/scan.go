package store

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// scanBuf is how much a scanner reads at a time.
const scanBuf = 256 << 10

// scanner reads the records of one segment file in order, verifying each.
// Recovery, Replay and the fuzz test use it.
type scanner struct {
	f    File
	seg  uint32
	off  int64 // offset of the next record
	end  int64 // where the scan stops: the file size or a known good end
	buf  []byte
	bOff int64 // file offset of buf[0]
}

// errTorn says the segment ends inside a record: a torn write or a cut.
var errTorn = errors.New("record runs past the end of the segment")

// next returns the next record, io.EOF at a clean end, or an error
// wrapping ErrCorrupt at a record that does not check; s.off is then the
// offset of that record.
func (s *scanner) next() (Record, error) {
	if s.off >= s.end {
		return Record{}, io.EOF
	}
	pos := Pos{Seg: s.seg, Off: uint32(s.off)}
	if s.end-s.off < recHeaderSize {
		return Record{}, fmt.Errorf("%w at %v: %w", ErrCorrupt, pos, errTorn)
	}
	h, err := s.peek(recHeaderSize)
	if err != nil {
		return Record{}, err
	}
	n, ok := headerLen(h)
	if !ok {
		return Record{}, fmt.Errorf("%w at %v: bad header", ErrCorrupt, pos)
	}
	size := recHeaderSize + int64(n)
	if size > s.end-s.off {
		return Record{}, fmt.Errorf("%w at %v: %d-byte %w", ErrCorrupt, pos, size, errTorn)
	}
	b, err := s.peek(int(size))
	if err != nil {
		return Record{}, err
	}
	rec, err := checkRecord(b, pos)
	if err != nil {
		return Record{}, err
	}
	s.off += size
	return rec, nil
}

// peek returns the n bytes at s.off, reading them if needed; n never
// exceeds s.end-s.off.
func (s *scanner) peek(n int) ([]byte, error) {
	if s.off >= s.bOff && s.off+int64(n) <= s.bOff+int64(len(s.buf)) {
		i := s.off - s.bOff
		return s.buf[i : i+int64(n)], nil
	}
	want := int(min(max(int64(n), scanBuf), s.end-s.off))
	if cap(s.buf) < want {
		s.buf = make([]byte, want)
	}
	s.buf = s.buf[:want]
	m, err := s.f.ReadAt(s.buf, s.off)
	s.buf, s.bOff = s.buf[:m], s.off
	if m < n {
		if err == nil || err == io.EOF {
			return nil, fmt.Errorf("%w at %v: %w", ErrCorrupt, Pos{Seg: s.seg, Off: uint32(s.off)}, errTorn)
		}
		return nil, fmt.Errorf("read %s at %d: %w", segName(s.seg), s.off, err)
	}
	return s.buf[:n], nil
}

// countFrom counts, best effort, the records lost by cutting a segment at
// off: the bad record, and the records after it that still check. It
// trusts the bad record's length field only if it fits in the file.
func countFrom(f File, seg uint32, off, end int64) int64 {
	if off >= end {
		return 0
	}
	s := &scanner{f: f, seg: seg, off: off, end: end}
	h, err := s.peek(int(min(recHeaderSize, end-off)))
	if err != nil || len(h) < recHeaderSize {
		return 1
	}
	n, _ := headerLen(h)
	if recHeaderSize+int64(n) > end-off {
		return 1
	}
	s.off += recHeaderSize + int64(n)
	count := int64(1)
	for {
		if _, err := s.next(); err != nil {
			if errors.Is(err, io.EOF) {
				return count
			}
			// Another bad record: count it and the rest as one stretch
			// of damage rather than guess further.
			return count + 1
		}
		count++
	}
}

// Replay calls fn with every record after the checkpoint that [Open]
// returned, in log order, up to where the log ended at Open: the records
// the caller's checkpoint state does not reflect (and, since checkpoints
// are fuzzy, perhaps some that it does: applying a record must be
// idempotent). Release records ([KindRelease]) are included. Payloads are
// valid only during the call. Replay stops at fn's first error and
// returns it.
//
// Replay may be called more than once, and concurrently with appends;
// records appended since Open are not included. Damage that Open found
// and reported in [Recovery.Corrupt] is skipped.
func (l *Log) Replay(fn func(Record) error) error {
	l.mu.Lock()
	ranges := l.replay
	l.mu.Unlock()
	var buf []byte
	for _, r := range ranges {
		f := (*l.files.Load())[r.seg]
		if f == nil {
			continue // deleted since: a later checkpoint covers it
		}
		s := &scanner{f: f, seg: r.seg, off: r.from, end: r.to, buf: buf[:0]}
		for {
			rec, err := s.next()
			if err == io.EOF {
				break
			}
			if errors.Is(err, os.ErrClosed) {
				break // deleted meanwhile: a newer checkpoint covers it
			}
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			if err := fn(rec); err != nil {
				return err
			}
		}
		buf = s.buf
	}
	return nil
}
