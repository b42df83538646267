package store

import (
	"hash/crc32"
	"testing"
)

func TestCRCSmall(t *testing.T) {
	for n := range 40 {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*31 + n)
		}
		if got, want := crcSmall(b), crc32.Checksum(b, castagnoli); got != want {
			t.Fatalf("%d bytes: %08x, want %08x", n, got, want)
		}
	}
}

func TestSegName(t *testing.T) {
	for _, n := range []uint32{1, 0xff, 0xdeadbeef, 1<<32 - 1} {
		if got, ok := parseSegName(segName(n)); !ok || got != n {
			t.Fatalf("%d: %s -> %d %v", n, segName(n), got, ok)
		}
	}
	for _, name := range []string{"00000000.seg", "1.seg", "0000000g.seg", "00000001.log", "000000001.seg"} {
		if _, ok := parseSegName(name); ok {
			t.Fatalf("%s parsed", name)
		}
	}
}

func TestPosOrder(t *testing.T) {
	ps := []Pos{{}, {1, 16}, {1, 4000}, {2, 16}, {1 << 31, 0}}
	for i := range ps {
		for j := range ps {
			if ps[i].Less(ps[j]) != (i < j) {
				t.Fatalf("%v < %v: %v", ps[i], ps[j], ps[i].Less(ps[j]))
			}
		}
	}
}
