package wire

import (
	"fmt"
	"testing"
)

// benchSizes are the REQUEST body sizes the benchmarks run with.
var benchSizes = []int{16, 128, 1 << 10, 64 << 10}

// benchRequest returns a REQUEST as a requester sends it: a request id, a
// deadline, the exchange, a sticky key, a trace header and the body.
func benchRequest(size int) *Frame {
	return &Frame{
		Type: TypeRequest, Ref: 123456, Aux: 5000, Name: "users", Key: "user.42",
		Header: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		Body:   make([]byte, size),
	}
}

func BenchmarkAppendFrame(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("body=%d", size), func(b *testing.B) {
			f := benchRequest(size)
			buf, err := AppendFrame(nil, f, DefaultMaxFrame)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				buf, err = AppendFrame(buf[:0], f, DefaultMaxFrame)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}

// loop reads a buffer of whole frames over and over, like a socket that
// never runs dry.
type loop struct {
	buf []byte
	off int
}

func (l *loop) Read(p []byte) (int, error) {
	n := copy(p, l.buf[l.off:])
	l.off = (l.off + n) % len(l.buf)
	return n, nil
}

func BenchmarkReaderNext(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("body=%d", size), func(b *testing.B) {
			f := benchRequest(size)
			one, err := AppendFrame(nil, f, DefaultMaxFrame)
			if err != nil {
				b.Fatal(err)
			}
			// At least 1 MiB of frames, so reads span many frames.
			var buf []byte
			for len(buf) < 1<<20 {
				buf = append(buf, one...)
			}
			r := NewReader(&loop{buf: buf}, DefaultMaxFrame)
			var g Frame
			b.SetBytes(int64(len(one)))
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Next(&g); err != nil {
					b.Fatal(err)
				}
			}
			if len(g.Body) != size {
				b.Fatalf("body of %d bytes, want %d", len(g.Body), size)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
		})
	}
}
