package queue

import (
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// ringVnodes is the number of points each consumer has on the ring: with
// 128, each consumer's share of the keys stays within about 1.5 times the
// mean (the broker's sticky routing uses the same).
const ringVnodes = 128

// ring is a consistent-hash ring over consumers, with virtual nodes, so
// that a consumer joining or leaving moves only its own share of keys. It
// is immutable once built.
type ring struct {
	hashes []uint64
	owners []*Consumer
}

// newRing builds the ring of cs, each placed by its tag (its stable
// identity). It returns nil for no consumers.
func newRing(cs []*Consumer) *ring {
	if len(cs) == 0 {
		return nil
	}
	type point struct {
		h uint64
		c *Consumer
	}
	pts := make([]point, 0, len(cs)*ringVnodes)
	var buf []byte
	for _, c := range cs {
		for v := range ringVnodes {
			buf = append(append(buf[:0], c.tag...), '#')
			buf = strconv.AppendInt(buf, int64(v), 10)
			pts = append(pts, point{xxhash.Sum64(buf), c})
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return 0
	})
	r := &ring{hashes: make([]uint64, len(pts)), owners: make([]*Consumer, len(pts))}
	for i, p := range pts {
		r.hashes[i], r.owners[i] = p.h, p.c
	}
	return r
}

// pick returns the consumer that owns hash h, or nil on an empty ring.
func (r *ring) pick(h uint64) *Consumer {
	if r == nil {
		return nil
	}
	i, _ := slices.BinarySearch(r.hashes, h)
	if i == len(r.hashes) {
		i = 0
	}
	return r.owners[i]
}

// keyHash is where a key falls on the ring.
func keyHash(key string) uint64 { return xxhash.Sum64String(key) }
