package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// The payloads of a queue's journal records, little-endian. The store
// adds its own header (checksum, length, queue id, kind).
//
//	KindEnqueue:
//	+------+------+---------+----------+-------+-------------+---------+-------------+
//	| v u8 | prio | nhdr u16| keyLen u32| id u64| enqueued i64| due i64 | expires i64 |  40 bytes
//	+------+------+---------+----------+-------+-------------+---------+-------------+
//	| key (keyLen bytes)                                                             |
//	| nhdr x { nameLen u16 | name | valueLen u32 | value }                           |
//	| body: the rest of the payload                                                  |
//	+--------------------------------------------------------------------------------+
//	times are unix nanoseconds; due and expires are 0 when unset
//
//	version 2, written when the message has a (producer, seq) for
//	deduplication, has them between the fixed part and the key:
//	| pidLen u8 | producer (pidLen bytes, 1 to 255) | seq u64 |
//	version 1 records, without them, are written and read as before.
//
//	KindAttempt:
//	+------+------+-------+--------------+--------+---------+
//	| v u8 | 0 u8 | 0 u16 | attempts u32 | id u64 | due i64 |  24 bytes
//	+------+------+-------+--------------+--------+---------+
//	attempts: failed attempts so far; due: when the message is ready
//	again (the failure's time plus the backoff)
//
// v is recordVersion (recordVersionDedup for an enqueue with a pair); a
// reader refuses other versions.

const (
	recordVersion      = 1
	recordVersionDedup = 2
	enqueueFixed       = 40
	attemptSize        = 24
	maxHeaderCount     = math.MaxUint16
	maxHeaderName      = math.MaxUint16
	maxKeyLen          = math.MaxUint16 // so that a snapshot entry holds it in a u16
	maxHeaderValues    = math.MaxUint32
)

// errBadRecord is wrapped by the decoders.
var errBadRecord = errors.New("queue: bad journal record")

// enqueueRecord is the content of a KindEnqueue record.
type enqueueRecord struct {
	id                     uint64
	prio                   uint8
	enqueued, due, expires int64
	key                    string
	headers                map[string]string
	body                   []byte // aliases the payload
	producer               string // version 2: the dedup pair
	seq                    uint64
}

// appendEnqueue encodes m's record onto dst.
func appendEnqueue(dst []byte, m *message) []byte {
	var h [enqueueFixed]byte
	h[0], h[1] = recordVersion, m.prio
	if m.dk != nil {
		h[0] = recordVersionDedup
	}
	binary.LittleEndian.PutUint16(h[2:], uint16(len(m.headers)))
	binary.LittleEndian.PutUint32(h[4:], uint32(len(m.key)))
	binary.LittleEndian.PutUint64(h[8:], m.id)
	binary.LittleEndian.PutUint64(h[16:], uint64(m.enqueued))
	binary.LittleEndian.PutUint64(h[24:], uint64(m.due))
	binary.LittleEndian.PutUint64(h[32:], uint64(m.expires))
	dst = append(dst, h[:]...)
	if m.dk != nil {
		dst = append(dst, uint8(len(m.dk.key.producer)))
		dst = append(dst, m.dk.key.producer...)
		dst = binary.LittleEndian.AppendUint64(dst, m.dk.key.seq)
	}
	dst = append(dst, m.key...)
	for k, v := range m.headers {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(k)))
		dst = append(dst, k...)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(v)))
		dst = append(dst, v...)
	}
	return append(dst, m.body...)
}

// checkHeaders reports whether headers and key fit the record format.
func checkHeaders(key string, headers map[string]string) error {
	if uint64(len(key)) > maxKeyLen {
		return fmt.Errorf("%w: key of %d bytes", ErrBadMessage, len(key))
	}
	if len(headers) > maxHeaderCount {
		return fmt.Errorf("%w: %d headers (max %d)", ErrBadMessage, len(headers), maxHeaderCount)
	}
	for k, v := range headers {
		if len(k) > maxHeaderName || uint64(len(v)) > maxHeaderValues {
			return fmt.Errorf("%w: header %.32q too long", ErrBadMessage, k)
		}
	}
	return nil
}

// decodeEnqueue decodes a KindEnqueue payload. The body aliases p; the
// key and headers are copies.
func decodeEnqueue(p []byte) (enqueueRecord, error) {
	var r enqueueRecord
	if len(p) < enqueueFixed {
		return r, fmt.Errorf("%w: enqueue record of %d bytes", errBadRecord, len(p))
	}
	if p[0] != recordVersion && p[0] != recordVersionDedup {
		return r, fmt.Errorf("%w: version %d", errBadRecord, p[0])
	}
	if p[1] > MaxPriority {
		return r, fmt.Errorf("%w: priority %d", errBadRecord, p[1])
	}
	r.prio = p[1]
	nhdr := int(binary.LittleEndian.Uint16(p[2:]))
	keyLen := uint64(binary.LittleEndian.Uint32(p[4:]))
	r.id = binary.LittleEndian.Uint64(p[8:])
	r.enqueued = int64(binary.LittleEndian.Uint64(p[16:]))
	r.due = int64(binary.LittleEndian.Uint64(p[24:]))
	r.expires = int64(binary.LittleEndian.Uint64(p[32:]))
	if r.id == 0 {
		return r, fmt.Errorf("%w: id 0", errBadRecord)
	}
	v := p[0]
	p = p[enqueueFixed:]
	if v == recordVersionDedup {
		if len(p) < 1 || p[0] == 0 || int(p[0])+9 > len(p) {
			return r, fmt.Errorf("%w: producer runs past the end", errBadRecord)
		}
		n := int(p[0])
		r.producer = string(p[1 : 1+n])
		r.seq = binary.LittleEndian.Uint64(p[1+n:])
		p = p[1+n+8:]
		if r.seq == 0 {
			return r, fmt.Errorf("%w: seq 0", errBadRecord)
		}
	}
	if keyLen > uint64(len(p)) {
		return r, fmt.Errorf("%w: key runs past the end", errBadRecord)
	}
	r.key, p = string(p[:keyLen]), p[keyLen:]
	if nhdr > 0 {
		r.headers = make(map[string]string, min(nhdr, len(p)/6))
	}
	for range nhdr {
		if len(p) < 2 {
			return r, fmt.Errorf("%w: header runs past the end", errBadRecord)
		}
		n := int(binary.LittleEndian.Uint16(p))
		p = p[2:]
		if n+4 > len(p) {
			return r, fmt.Errorf("%w: header runs past the end", errBadRecord)
		}
		k := string(p[:n])
		p = p[n:]
		vn := uint64(binary.LittleEndian.Uint32(p))
		p = p[4:]
		if vn > uint64(len(p)) {
			return r, fmt.Errorf("%w: header value runs past the end", errBadRecord)
		}
		r.headers[k] = string(p[:vn])
		p = p[vn:]
	}
	r.body = p
	return r, nil
}

// attemptRecord is the content of a KindAttempt record.
type attemptRecord struct {
	id       uint64
	attempts uint32
	due      int64
}

func appendAttempt(dst []byte, id uint64, attempts uint32, due int64) []byte {
	var b [attemptSize]byte
	b[0] = recordVersion
	binary.LittleEndian.PutUint32(b[4:], attempts)
	binary.LittleEndian.PutUint64(b[8:], id)
	binary.LittleEndian.PutUint64(b[16:], uint64(due))
	return append(dst, b[:]...)
}

func decodeAttempt(p []byte) (attemptRecord, error) {
	if len(p) != attemptSize {
		return attemptRecord{}, fmt.Errorf("%w: attempt record of %d bytes", errBadRecord, len(p))
	}
	if p[0] != recordVersion {
		return attemptRecord{}, fmt.Errorf("%w: version %d", errBadRecord, p[0])
	}
	r := attemptRecord{
		attempts: binary.LittleEndian.Uint32(p[4:]),
		id:       binary.LittleEndian.Uint64(p[8:]),
		due:      int64(binary.LittleEndian.Uint64(p[16:])),
	}
	if r.id == 0 {
		return r, fmt.Errorf("%w: id 0", errBadRecord)
	}
	return r, nil
}
