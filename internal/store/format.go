package store

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
)

// Sizes of the fixed headers; see the package doc for the layouts.
const (
	segHeaderSize = 16
	recHeaderSize = 16
)

// segMagic opens every segment file; ckptMagic every checkpoint file.
var (
	segMagic  = [4]byte{'C', 'R', 'S', 'G'}
	ckptMagic = [4]byte{'C', 'R', 'C', 'K'}
)

// formatVersion is written in segment and checkpoint headers; a reader
// refuses other versions.
const formatVersion = 1

// castagnoli is the CRC-32C table, accelerated by SSE4.2 and ARMv8.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Pos is a position in the log: a segment number and a byte offset in it.
// Positions grow with every append, across segments. The zero Pos is
// before every record.
type Pos struct {
	Seg uint32 // segment number, from 1
	Off uint32 // byte offset of a record header in the segment file
}

// Less reports whether p comes before q in the log.
func (p Pos) Less(q Pos) bool { return p.key() < q.key() }

func (p Pos) key() uint64 { return uint64(p.Seg)<<32 | uint64(p.Off) }

func posFromKey(k uint64) Pos { return Pos{Seg: uint32(k >> 32), Off: uint32(k)} }

func (p Pos) String() string { return fmt.Sprintf("%d:%d", p.Seg, p.Off) }

// Ref names one record: where it starts and its payload length. [Log.Append]
// returns it; the caller keeps it to [Log.Read] the record back in a single
// read and to [Log.Release] it.
type Ref struct {
	Pos
	Len uint32 // payload length in bytes
}

// Size is the record's size on disk, header included.
func (r Ref) Size() int64 { return recHeaderSize + int64(r.Len) }

// end is the position just past the record.
func (r Ref) end() Pos { return Pos{Seg: r.Seg, Off: r.Off + recHeaderSize + r.Len} }

// Kind tells records apart for the caller (a message, an ack, a queue
// creation...). 0 is never valid, so that zeroed disk is never a record;
// kinds from [KindReserved] up belong to the store.
type Kind uint8

const (
	// KindReserved is the first kind reserved by the store. Callers use 1
	// to KindReserved-1.
	KindReserved Kind = 0xF0
	// KindRelease marks a record written by [Log.Release]: its payload
	// lists the released records. [Log.Replay] passes these to the
	// caller; decode them with [Record.Released].
	KindRelease Kind = 0xFF
)

// Record is one record read from the log.
type Record struct {
	Ref
	Queue   uint32 // the queue id given to Append
	Kind    Kind
	Payload []byte // valid until the buffer it aliases is reused
}

// Released decodes the refs listed by a [KindRelease] record, appending
// them to dst.
func (r Record) Released(dst []Ref) ([]Ref, error) {
	if r.Kind != KindRelease || len(r.Payload)%releaseEntrySize != 0 {
		return dst, fmt.Errorf("%w: not a release record (kind %d, %d bytes)", ErrCorrupt, r.Kind, len(r.Payload))
	}
	for b := r.Payload; len(b) > 0; b = b[releaseEntrySize:] {
		dst = append(dst, Ref{
			Pos: Pos{Seg: binary.LittleEndian.Uint32(b), Off: binary.LittleEndian.Uint32(b[4:])},
			Len: binary.LittleEndian.Uint32(b[8:]),
		})
	}
	return dst, nil
}

// releaseEntrySize is the size of one ref in a release record's payload:
// seg u32, off u32, len u32.
const releaseEntrySize = 12

func appendReleaseEntry(b []byte, r Ref) []byte {
	b = binary.LittleEndian.AppendUint32(b, r.Seg)
	b = binary.LittleEndian.AppendUint32(b, r.Off)
	return binary.LittleEndian.AppendUint32(b, r.Len)
}

// putRecordHeader fills h (recHeaderSize bytes) for a payload, checksum
// included; the checksum covers h[4:] and the payload:
//
//	| crc u32 | len u32 | queue u32 | kind u8 | 0 u8 | 0 u16 |
func putRecordHeader(h []byte, queue uint32, kind Kind, payload []byte) {
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[8:], queue)
	h[12], h[13], h[14], h[15] = byte(kind), 0, 0, 0
	crc := crcSmall(h[4:recHeaderSize])
	crc = crc32.Update(crc, castagnoli, payload)
	binary.LittleEndian.PutUint32(h, crc)
}

// crcSmall is crc32.Checksum(b, castagnoli) for a few bytes, a byte at a
// time: unlike crc32.Update, it does not make b escape, so the caller's
// header stays on its stack.
func crcSmall(b []byte) uint32 {
	crc := ^uint32(0)
	for _, c := range b {
		crc = castagnoli[byte(crc)^c] ^ (crc >> 8)
	}
	return ^crc
}

// headerLen returns the payload length in a record header, and whether the
// rest of the header (kind, reserved bytes) is plausible.
func headerLen(h []byte) (uint32, bool) {
	kind := Kind(h[12])
	return binary.LittleEndian.Uint32(h[4:]), kind != 0 && h[13] == 0 && h[14] == 0 && h[15] == 0
}

// checkRecord verifies a whole record (header and payload) in b and
// decodes it.
func checkRecord(b []byte, pos Pos) (Record, error) {
	if len(b) < recHeaderSize {
		return Record{}, fmt.Errorf("%w at %v: short record", ErrCorrupt, pos)
	}
	n, ok := headerLen(b)
	if !ok || int64(n) != int64(len(b))-recHeaderSize {
		return Record{}, fmt.Errorf("%w at %v: bad header", ErrCorrupt, pos)
	}
	crc := crc32.Update(0, castagnoli, b[4:])
	if crc != binary.LittleEndian.Uint32(b) {
		return Record{}, fmt.Errorf("%w at %v: checksum mismatch", ErrCorrupt, pos)
	}
	return Record{
		Ref:     Ref{Pos: pos, Len: n},
		Queue:   binary.LittleEndian.Uint32(b[8:]),
		Kind:    Kind(b[12]),
		Payload: b[recHeaderSize:],
	}, nil
}

// appendSegHeader appends the header of segment seg:
//
//	| "CRSG" | version u8 | 0 0 0 | seg u32 | crc32c of the first 12 bytes u32 |
func appendSegHeader(b []byte, seg uint32) []byte {
	start := len(b)
	b = append(b, segMagic[:]...)
	b = append(b, formatVersion, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, seg)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:start+12], castagnoli))
}

// checkSegHeader verifies a segment header read from the file of segment
// seg.
func checkSegHeader(h []byte, seg uint32) error {
	switch {
	case len(h) < segHeaderSize:
		return fmt.Errorf("%w: short segment header", ErrCorrupt)
	case [4]byte(h[:4]) != segMagic:
		return fmt.Errorf("%w: not a segment (magic %q)", ErrCorrupt, h[:4])
	case crc32.Checksum(h[:12], castagnoli) != binary.LittleEndian.Uint32(h[12:]):
		return fmt.Errorf("%w: segment header checksum mismatch", ErrCorrupt)
	case h[4] != formatVersion:
		return fmt.Errorf("%w: segment format version %d, want %d", ErrCorrupt, h[4], formatVersion)
	case binary.LittleEndian.Uint32(h[8:]) != seg:
		return fmt.Errorf("%w: header names segment %d", ErrCorrupt, binary.LittleEndian.Uint32(h[8:]))
	}
	return nil
}

// File names in a log directory.
const (
	segSuffix      = ".seg"
	checkpointName = "CHECKPOINT"
	checkpointTemp = "CHECKPOINT.tmp"
	lockName       = "LOCK"
)

// segName is the file name of segment seg: 8 hex digits, so that names
// sort in log order.
func segName(seg uint32) string { return fmt.Sprintf("%08x%s", seg, segSuffix) }

// parseSegName returns the segment number a file name stands for.
func parseSegName(name string) (uint32, bool) {
	hex, ok := strings.CutSuffix(name, segSuffix)
	if !ok || len(hex) != 8 {
		return 0, false
	}
	n, err := strconv.ParseUint(hex, 16, 32)
	if err != nil || n == 0 {
		return 0, false
	}
	return uint32(n), true
}
