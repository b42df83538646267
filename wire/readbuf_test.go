package wire

import (
	"bytes"
	"io"
	"testing"
)

// feed is a stream whose reads are handed out one chunk at a time, as a
// socket returns what has arrived.
type feed struct{ chunks [][]byte }

func (f *feed) Read(p []byte) (int, error) {
	if len(f.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, f.chunks[0])
	if f.chunks[0] = f.chunks[0][n:]; len(f.chunks[0]) == 0 {
		f.chunks = f.chunks[1:]
	}
	return n, nil
}

func frames(t *testing.T, n, body int) []byte {
	t.Helper()
	var b []byte
	for i := range n {
		var err error
		b, err = AppendFrame(b, &Frame{Type: TypePublish, Ref: uint64(i), Name: "room", Body: bytes.Repeat([]byte{'x'}, body)}, DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// TestReaderBufferFollowsTraffic checks that an idle connection's reader
// holds a small buffer and small arena chunks, that a burst grows the
// buffer to maxReadBuf, and that quiet traffic shrinks it back.
func TestReaderBufferFollowsTraffic(t *testing.T) {
	small := frames(t, 1, 16)
	burst := frames(t, 2000, 100) // ~250 KB arriving at once
	var chunks [][]byte
	chunks = append(chunks, small)
	chunks = append(chunks, burst)
	for range 64 {
		chunks = append(chunks, frames(t, 1, 16))
	}
	r := NewReader(&feed{chunks: chunks}, DefaultMaxFrame)
	var f Frame

	if err := r.Next(&f); err != nil {
		t.Fatal(err)
	}
	if len(r.buf) > minReadBuf || cap(f.Body) > 16 || len(r.arena) > minReadBuf {
		t.Errorf("after one small frame: buffer %d, arena left %d; want at most %d each", len(r.buf), len(r.arena), minReadBuf)
	}
	for range 2000 {
		if err := r.Next(&f); err != nil {
			t.Fatal(err)
		}
	}
	if r.want != maxReadBuf {
		t.Errorf("after a burst the buffer is to be %d bytes, want %d", r.want, maxReadBuf)
	}
	for range 64 {
		if err := r.Next(&f); err != nil {
			t.Fatal(err)
		}
	}
	if r.want > maxReadBuf/8 || len(r.buf) > maxReadBuf/4 {
		t.Errorf("after quiet traffic: buffer %d, to be %d; want it shrunk", len(r.buf), r.want)
	}
	if err := r.Next(&f); err != io.EOF {
		t.Errorf("at the end: %v, want EOF", err)
	}
}

// TestReaderLargeFramesKeepBuffer checks that frames larger than
// maxReadBuf do not cost a new buffer each.
func TestReaderLargeFramesKeepBuffer(t *testing.T) {
	one := frames(t, 1, maxReadBuf)
	var chunks [][]byte
	for range 10 {
		chunks = append(chunks, one)
	}
	r := NewReader(&feed{chunks: chunks}, DefaultMaxFrame)
	var f Frame
	if err := r.Next(&f); err != nil {
		t.Fatal(err)
	}
	first := &r.buf[0]
	for range 9 {
		if err := r.Next(&f); err != nil {
			t.Fatal(err)
		}
		if len(f.Body) != maxReadBuf {
			t.Fatalf("body of %d bytes", len(f.Body))
		}
	}
	if &r.buf[0] != first {
		t.Error("the buffer was replaced between large frames of one size")
	}
}

// TestReaderGivesBackWithoutLoss: a frame much larger than the buffer,
// read in many small pieces (which shrink the size the buffer is to
// take), followed in the same piece by the start of a small frame: the
// large buffer given back keeps every byte of the small frame.
func TestReaderGivesBackWithoutLoss(t *testing.T) {
	big := frames(t, 1, 1<<20)
	small := frames(t, 1, 3000)
	stream := append(append([]byte(nil), big...), small...)
	var chunks [][]byte
	cut := len(big) + 2000 // the last piece of the big frame and part of the small one
	for off := 0; off < cut; off += 16 << 10 {
		chunks = append(chunks, stream[off:min(off+16<<10, cut)])
	}
	chunks = append(chunks, stream[cut:])
	r := NewReader(&feed{chunks: chunks}, 4<<20)
	var f Frame
	if err := r.Next(&f); err != nil || len(f.Body) != 1<<20 {
		t.Fatalf("large frame: %d bytes, %v", len(f.Body), err)
	}
	if err := r.Next(&f); err != nil || len(f.Body) != 3000 || !bytes.Equal(f.Body, bytes.Repeat([]byte{'x'}, 3000)) {
		t.Fatalf("small frame after it: %d bytes, %v", len(f.Body), err)
	}
}
