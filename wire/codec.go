package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Protocol limits.
const (
	// Version is the highest protocol version this package speaks.
	Version = 1
	// DefaultMaxFrame is the default largest frame, counted after the
	// length prefix: 4 MiB.
	DefaultMaxFrame = 4 << 20
	// HandshakeMaxFrame bounds frames before the handshake completes.
	HandshakeMaxFrame = 64 << 10
	// MaxHeaders bounds the number of headers in one frame.
	MaxHeaders = 256
	// minFrame is type, flags and fields.
	minFrame = 3
)

// Decoding errors. Each is wrapped with detail; test with errors.Is.
var (
	ErrFrameTooLarge = errors.New("wire: frame too large")
	ErrMalformed     = errors.New("wire: malformed frame")
)

// AppendFrame appends the encoding of f to dst and returns the extended
// slice. It fails only when the frame would exceed max bytes (0: no limit).
func AppendFrame(dst []byte, f *Frame, max int) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(f.Type), byte(f.Flags), 0)
	var fields uint8
	if f.Ref != 0 {
		fields |= fRef
		dst = binary.AppendUvarint(dst, f.Ref)
	}
	if f.Attach != 0 {
		fields |= fAttach
		dst = binary.AppendUvarint(dst, uint64(f.Attach))
	}
	if f.Aux != 0 {
		fields |= fAux
		dst = binary.AppendUvarint(dst, f.Aux)
	}
	if f.Name != "" {
		fields |= fName
		dst = appendString(dst, f.Name)
	}
	if f.Key != "" {
		fields |= fKey
		dst = appendString(dst, f.Key)
	}
	if f.Tag != "" {
		fields |= fTag
		dst = appendString(dst, f.Tag)
	}
	if len(f.Header) != 0 {
		fields |= fHeader
		dst = binary.AppendUvarint(dst, uint64(len(f.Header)))
		for k, v := range f.Header {
			dst = appendString(dst, k)
			dst = appendString(dst, v)
		}
	}
	if len(f.Body) != 0 {
		fields |= fBody
		dst = append(dst, f.Body...)
	}
	n := len(dst) - start - 4
	if max > 0 && n > max {
		return dst[:start], fmt.Errorf("%w: %s of %d bytes, limit %d", ErrFrameTooLarge, f.Type, n, max)
	}
	dst[start+6] = fields
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode decodes one frame from p, the bytes after the length prefix, into
// f. Body aliases p; strings are copied. Decode never panics and never
// reads outside p.
func Decode(p []byte, f *Frame) error {
	return decode(p, f, nil)
}

func decode(p []byte, f *Frame, in *interner) error {
	if len(p) < minFrame {
		return fmt.Errorf("%w: %d bytes, need at least %d", ErrMalformed, len(p), minFrame)
	}
	t, flags, fields := Type(p[0]), Flags(p[1]), p[2]
	if !t.Valid() {
		return fmt.Errorf("%w: unknown frame type 0x%02x", ErrMalformed, byte(t))
	}
	if flags&^allFlags != 0 {
		return fmt.Errorf("%w: %s: unknown flags 0x%02x", ErrMalformed, t, byte(flags))
	}
	*f = Frame{Type: t, Flags: flags}
	d := decoder{p: p[3:]}
	if fields&fRef != 0 {
		f.Ref = d.uvarint("ref")
	}
	if fields&fAttach != 0 {
		a := d.uvarint("attach")
		if a > 1<<32-1 {
			d.fail("attach id overflows 32 bits")
		}
		f.Attach = uint32(a)
	}
	if fields&fAux != 0 {
		f.Aux = d.uvarint("aux")
	}
	if fields&fName != 0 {
		f.Name = d.str("name", in.names())
	}
	if fields&fKey != 0 {
		f.Key = d.key(in)
	}
	if fields&fTag != 0 {
		f.Tag = d.str("tag", in.names())
	}
	if fields&fHeader != 0 {
		n := d.uvarint("header count")
		if n > MaxHeaders {
			d.fail(fmt.Sprintf("%d headers, limit %d", n, MaxHeaders))
		} else if d.err == nil {
			f.Header = make(map[string]string, n)
			for i := uint64(0); i < n && d.err == nil; i++ {
				k := d.str("header name", nil)
				f.Header[k] = d.str("header value", nil)
			}
		}
	}
	if d.err != nil {
		return fmt.Errorf("%w: %s: %s", ErrMalformed, t, d.err)
	}
	if fields&fBody != 0 {
		if len(d.p) == 0 {
			return fmt.Errorf("%w: %s: body flagged but empty", ErrMalformed, t)
		}
		f.Body = d.p
	} else if len(d.p) != 0 {
		return fmt.Errorf("%w: %s: %d trailing bytes", ErrMalformed, t, len(d.p))
	}
	return nil
}

type decodeError string

func (e decodeError) Error() string { return string(e) }

type decoder struct {
	p   []byte
	err error
}

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = decodeError(msg)
	}
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.fail("bad varint in " + what)
		return 0
	}
	d.p = d.p[n:]
	return v
}

// interner keeps the strings a Reader decoded, so that the ones that
// repeat from frame to frame are not allocated again: exchange names and
// tags (few), and the last routing key (a publisher's stream of messages
// mostly has one).
type interner struct {
	m       map[string]string
	lastKey string
}

// names returns the map of names and tags; nil for a nil interner.
func (in *interner) names() map[string]string {
	if in == nil {
		return nil
	}
	return in.m
}

// key decodes a routing key, the same string as the last one if the
// bytes are the same.
func (d *decoder) key(in *interner) string {
	b := d.bytes("key")
	switch {
	case d.err != nil:
		return ""
	case in == nil:
		return string(b)
	case string(b) == in.lastKey:
		return in.lastKey
	}
	in.lastKey = string(b)
	return in.lastKey
}

func (d *decoder) str(what string, intern map[string]string) string {
	b := d.bytes(what)
	if d.err != nil {
		return ""
	}
	if intern != nil {
		if s, ok := intern[string(b)]; ok {
			return s
		}
		s := string(b)
		if len(intern) < 4096 {
			intern[s] = s
		}
		return s
	}
	return string(b)
}

// bytes decodes a length-prefixed UTF-8 string's bytes, aliasing the frame.
func (d *decoder) bytes(what string) []byte {
	if d.err != nil {
		return nil
	}
	n, k := binary.Uvarint(d.p)
	if k <= 0 {
		d.fail("bad varint in " + what + " length")
		return nil
	}
	d.p = d.p[k:]
	if n > uint64(len(d.p)) {
		d.fail(what + " runs past the frame")
		return nil
	}
	b := d.p[:n]
	d.p = d.p[n:]
	if !utf8.Valid(b) {
		d.fail(what + " is not UTF-8")
		return nil
	}
	return b
}

// Reader reads frames from a stream. It is not safe for concurrent use.
//
// Its buffer follows the traffic, as nats-server's read buffers do: it
// starts at [minReadBuf], doubles (up to [maxReadBuf]) after a read
// that filled it, and halves after [shrinkAfter] reads in a row that
// used less than a quarter of it, so that an idle connection holds a
// few hundred bytes and a busy one reads 64 KiB at a time. Bodies are
// copied into arena chunks sized like the buffer, so the small bodies an
// idle connection's frames leave behind (names, patterns) keep small
// chunks alive, not 64 KiB ones.
type Reader struct {
	r      io.Reader
	buf    []byte
	start  int
	end    int
	max    int
	want   int // the size the buffer takes when next it is empty
	small  int // reads in a row that used under a quarter of the buffer
	arena  []byte
	intern interner
}

// The read buffer's bounds (see [Reader]); a frame larger than
// maxReadBuf gets a buffer of its size while it is read.
const (
	minReadBuf  = 512
	maxReadBuf  = 64 << 10
	maxKeptBuf  = 256 << 10 // a buffer grown for large frames keeps up to this
	shrinkAfter = 8
)

// NewReader returns a Reader on r that refuses frames larger than max bytes.
func NewReader(r io.Reader, max int) *Reader {
	return &Reader{r: r, buf: make([]byte, minReadBuf), want: minReadBuf, max: max, intern: interner{m: make(map[string]string)}}
}

// SetMax changes the largest accepted frame, as after a handshake.
func (r *Reader) SetMax(max int) { r.max = max }

// Buffered reports whether a whole frame is already buffered, so that the
// caller can batch work before a read would block.
func (r *Reader) Buffered() bool {
	n := r.end - r.start
	if n < 4 {
		return false
	}
	return n >= 4+int(binary.BigEndian.Uint32(r.buf[r.start:]))
}

// Head returns the bytes read and not yet decoded, such as the start of
// a frame that [Reader.Next] refused: enough to tell another protocol
// (an HTTP request, a TLS handshake) from Courier's. The slice is valid
// until the next call.
func (r *Reader) Head() []byte { return r.buf[r.start:r.end] }

// Next reads the next frame into f. f.Body is a fresh slice the caller may
// keep. Errors from the stream are returned as they are; a bad frame gives
// an error wrapping [ErrMalformed] or [ErrFrameTooLarge], after which the
// stream is no longer in sync and must be closed.
func (r *Reader) Next(f *Frame) error {
	if err := r.fill(4); err != nil {
		return err
	}
	n := int(binary.BigEndian.Uint32(r.buf[r.start:]))
	if n > r.max {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, r.max)
	}
	if err := r.fill(4 + n); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	p := r.buf[r.start+4 : r.start+4+n]
	r.start += 4 + n
	if err := decode(p, f, &r.intern); err != nil {
		return err
	}
	if len(f.Body) > 0 {
		f.Body = r.carve(f.Body)
	}
	return nil
}

// carve copies b into the arena so that it outlives the read buffer; one
// allocation serves many small bodies.
func (r *Reader) carve(b []byte) []byte {
	if len(b) > 16<<10 {
		return append([]byte(nil), b...)
	}
	if len(r.arena) < len(b) {
		r.arena = make([]byte, max(4*len(b), min(len(r.buf), maxReadBuf)))
	}
	c := r.arena[:len(b):len(b)]
	copy(c, b)
	r.arena = r.arena[len(b):]
	return c
}

// fill makes sure at least n bytes are buffered.
func (r *Reader) fill(n int) error {
	if r.end-r.start >= n {
		return nil
	}
	switch {
	case r.start == r.end && len(r.buf) != r.want && n <= r.want:
		// Empty: resize for free, to what the traffic asked for.
		r.buf, r.start, r.end = make([]byte, r.want), 0, 0
	case n > len(r.buf) || r.start+n > len(r.buf) && r.want > len(r.buf):
		// Too small for the frame, or to be grown anyway: move what is
		// buffered to a larger buffer, and keep that size for the next
		// large frame, up to the size given back below.
		nb := make([]byte, max(n, r.want))
		r.end = copy(nb, r.buf[r.start:r.end])
		r.start = 0
		r.buf = nb
		r.want = max(r.want, min(len(nb), maxKeptBuf))
	case r.start+n > len(r.buf):
		r.end = copy(r.buf, r.buf[r.start:r.end])
		r.start = 0
	}
	for empty := 0; r.end-r.start < n; {
		room := len(r.buf) - r.end
		m, err := r.r.Read(r.buf[r.end:])
		r.end += m
		r.adapt(m, room)
		if m == 0 && err == nil {
			if empty++; empty == 100 {
				return io.ErrNoProgress
			}
			continue
		}
		if err != nil {
			if r.end-r.start >= n {
				return nil
			}
			if err == io.EOF && r.end-r.start > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	// Give back a large buffer once it has drained.
	if len(r.buf) > maxKeptBuf && r.end-r.start < maxReadBuf && n <= maxReadBuf {
		r.want = min(r.want, maxKeptBuf)
		nb := make([]byte, max(r.want, r.end-r.start))
		r.end = copy(nb, r.buf[r.start:r.end])
		r.start = 0
		r.buf = nb
	}
	return nil
}

// adapt sets the size the buffer takes when next it is empty, from a
// read of m bytes into room: double after a read that filled the room,
// halve after shrinkAfter reads in a row that used under a quarter of
// the buffer.
func (r *Reader) adapt(m, room int) {
	switch {
	case m == room && m > 0:
		r.small = 0
		r.want = max(r.want, min(2*len(r.buf), maxReadBuf))
	case m < len(r.buf)/4:
		if r.small++; r.small >= shrinkAfter && r.want > minReadBuf {
			r.want = max(r.want/2, minReadBuf)
			r.small = 0
		}
	default:
		r.small = 0
	}
}

// Check reports whether f would decode on the other side: a known type
// and flags, UTF-8 strings and at most [MaxHeaders] headers. Senders call
// it so that a bad frame fails where it was made, not at the peer, where
// it would close the connection.
func (f *Frame) Check() error {
	switch {
	case !f.Type.Valid():
		return fmt.Errorf("%w: unknown frame type 0x%02x", ErrMalformed, byte(f.Type))
	case f.Flags&^allFlags != 0:
		return fmt.Errorf("%w: %s: unknown flags 0x%02x", ErrMalformed, f.Type, byte(f.Flags))
	case !utf8.ValidString(f.Name):
		return fmt.Errorf("%w: %s: name is not UTF-8", ErrMalformed, f.Type)
	case !utf8.ValidString(f.Key):
		return fmt.Errorf("%w: %s: key is not UTF-8", ErrMalformed, f.Type)
	case !utf8.ValidString(f.Tag):
		return fmt.Errorf("%w: %s: tag is not UTF-8", ErrMalformed, f.Type)
	case len(f.Header) > MaxHeaders:
		return fmt.Errorf("%w: %s: %d headers, limit %d", ErrMalformed, f.Type, len(f.Header), MaxHeaders)
	}
	if len(f.Header) == 0 {
		return nil
	}
	for k, v := range f.Header {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("%w: %s: header %q is not UTF-8", ErrMalformed, f.Type, k)
		}
	}
	return nil
}
