package store

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

// A checkpoint file, CHECKPOINT, little-endian:
//
//	+--------+----+-----+--------+--------+-------+----------+
//	| "CRCK" | v1 | 0x3 | at.Seg | at.Off | nsegs | stateLen |   28 bytes
//	+--------+----+-----+--------+--------+-------+----------+
//	| nsegs x { seg u32 | live records u32 | live bytes u32 } |
//	+---------------------------------------------------------+
//	| state (stateLen bytes, the caller's)                    |
//	+---------------------------------------------------------+
//	| crc32c of everything above u32                          |
//	+---------------------------------------------------------+

const (
	ckptHeaderSize = 28
	ckptEntrySize  = 12
)

// segCount is one segment's accounting as a checkpoint records it.
type segCount struct {
	seg             uint32
	live, liveBytes int64
}

// checkpoint is a decoded checkpoint file.
type checkpoint struct {
	at    Pos
	segs  []segCount
	state []byte
}

func encodeCheckpoint(c *checkpoint) []byte {
	head, tail := encodeCheckpointParts(c)
	return append(append(head, c.state...), tail...)
}

// encodeCheckpointParts encodes a checkpoint without copying its state:
// the file is head, then c.state, then tail (the checksum).
func encodeCheckpointParts(c *checkpoint) (head, tail []byte) {
	b := make([]byte, 0, ckptHeaderSize+len(c.segs)*ckptEntrySize)
	b = append(b, ckptMagic[:]...)
	b = append(b, formatVersion, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, c.at.Seg)
	b = binary.LittleEndian.AppendUint32(b, c.at.Off)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.segs)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(c.state)))
	for _, s := range c.segs {
		b = binary.LittleEndian.AppendUint32(b, s.seg)
		b = binary.LittleEndian.AppendUint32(b, uint32(s.live))
		b = binary.LittleEndian.AppendUint32(b, uint32(s.liveBytes))
	}
	sum := crc32.Update(crc32.Checksum(b, castagnoli), castagnoli, c.state)
	return b, binary.LittleEndian.AppendUint32(nil, sum)
}

func decodeCheckpoint(b []byte) (*checkpoint, error) {
	if len(b) < ckptHeaderSize+4 {
		return nil, fmt.Errorf("%w: %d bytes", ErrBadCheckpoint, len(b))
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	switch {
	case [4]byte(b[:4]) != ckptMagic:
		return nil, fmt.Errorf("%w: bad magic %q", ErrBadCheckpoint, b[:4])
	case crc32.Checksum(body, castagnoli) != sum:
		return nil, fmt.Errorf("%w: checksum mismatch", ErrBadCheckpoint)
	case b[4] != formatVersion:
		return nil, fmt.Errorf("%w: version %d, want %d", ErrBadCheckpoint, b[4], formatVersion)
	}
	c := &checkpoint{at: Pos{Seg: binary.LittleEndian.Uint32(b[8:]), Off: binary.LittleEndian.Uint32(b[12:])}}
	nsegs := uint64(binary.LittleEndian.Uint32(b[16:]))
	stateLen := binary.LittleEndian.Uint64(b[20:])
	if uint64(len(body)-ckptHeaderSize) != nsegs*ckptEntrySize+stateLen {
		return nil, fmt.Errorf("%w: lengths do not add up", ErrBadCheckpoint)
	}
	p := body[ckptHeaderSize:]
	for range nsegs {
		c.segs = append(c.segs, segCount{
			seg:       binary.LittleEndian.Uint32(p),
			live:      int64(binary.LittleEndian.Uint32(p[4:])),
			liveBytes: int64(binary.LittleEndian.Uint32(p[8:])),
		})
		p = p[ckptEntrySize:]
	}
	c.state = p
	return c, nil
}

// readCheckpoint reads and decodes the checkpoint file.
func readCheckpoint(fs FS, name string) (*checkpoint, error) {
	f, err := fs.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	size, err := f.Size()
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	if n, err := f.ReadAt(b, 0); n < len(b) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeCheckpoint(b)
}

// Checkpoint saves the caller's state so that the next [Open] returns it
// and [Log.Replay] starts after it, and lets the log delete the dead
// segments it covers. It returns the checkpoint's position.
//
// It takes a cut: the position at that moment and the segments' live
// counts. Then it calls snapshot with the position; snapshot returns the
// caller's serialized state, which must reflect every record before at
// (appended or released) and may reflect later ones (replay must be
// idempotent). The simple way to get this right: update the state under
// a lock held across each Append or Release and the state change, and
// have snapshot read the state under that lock. Then Checkpoint syncs the log, so
// that everything the state refers to is durable, and writes the file
// atomically: a temporary file, fsync, rename over CHECKPOINT, fsync of
// the directory. A crash at any point leaves the previous checkpoint or
// the new one, never a mix.
//
// Runs ([Log.WriteRun]) written since the previous checkpoint are synced
// before the checkpoint file is written, so that the state may name them;
// runs dropped before snapshot is called are deleted once the file is
// durable.
//
// Checkpoint keeps nothing of the state once it returns: the caller may
// reuse its buffer for the next one.
//
// Checkpoints run one at a time; appends go on meanwhile. How often to
// checkpoint is the caller's choice: restart replays what was appended
// since the last one, and dead segments are deleted only once a
// checkpoint is past them.
func (l *Log) Checkpoint(snapshot func(at Pos) ([]byte, error)) (Pos, error) {
	l.ckptMu.Lock()
	defer l.ckptMu.Unlock()

	l.mu.Lock()
	if l.err != nil || l.closing {
		err := l.err
		if err == nil {
			err = ErrClosed
		}
		l.mu.Unlock()
		return Pos{}, err
	}
	c := &checkpoint{at: l.next}
	if c.at.Off == 0 {
		c.at = Pos{Seg: l.nextSeg} // nothing appended yet: from the start of the next segment
	}
	for _, s := range l.segs {
		c.segs = append(c.segs, segCount{seg: s.num, live: s.live, liveBytes: s.liveBytes})
	}
	l.mu.Unlock()
	slices.SortFunc(c.segs, func(a, b segCount) int { return cmp.Compare(a.seg, b.seg) })

	// Runs dropped before the snapshot is taken are not in it: they go
	// once this checkpoint is durable.
	dropped := l.takeDropped()
	state, err := snapshot(c.at)
	if err != nil {
		l.giveBackDropped(dropped)
		return Pos{}, fmt.Errorf("checkpoint: snapshot: %w", err)
	}
	c.state = state
	if err := l.Sync(); err != nil {
		l.giveBackDropped(dropped)
		return Pos{}, fmt.Errorf("checkpoint: %w", err)
	}
	if err := l.syncRuns(); err != nil {
		l.giveBackDropped(dropped)
		return Pos{}, fmt.Errorf("checkpoint: %w", err)
	}
	head, tail := encodeCheckpointParts(c)
	if err := writeCheckpoint(l.fs, l.dir, head, c.state, tail); err != nil {
		l.giveBackDropped(dropped)
		return Pos{}, fmt.Errorf("checkpoint: %w", err)
	}
	l.deleteRuns(dropped)
	l.mu.Lock()
	l.ckpt = c.at
	l.mu.Unlock()
	l.stats.checkpoints.Add(1)
	l.collect()
	return c.at, nil
}

// writeCheckpoint replaces the checkpoint file atomically and durably
// with parts, one after the other (a state of megabytes is written
// from the caller's buffer, not copied).
func writeCheckpoint(fs FS, dir string, parts ...[]byte) error {
	tmp := join(dir, checkpointTemp)
	f, err := fs.Create(tmp)
	if err != nil {
		return err
	}
	var off int64
	for _, p := range parts {
		if err != nil || len(p) == 0 {
			continue
		}
		_, err = f.WriteAt(p, off)
		off += int64(len(p))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fs.Remove(tmp)
		return fmt.Errorf("write %s: %w", checkpointTemp, err)
	}
	if err := fs.Rename(tmp, join(dir, checkpointName)); err != nil {
		return err
	}
	return fs.SyncDir(dir)
}
