package amqp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frame types.
const (
	FrameMethod    = 1
	FrameHeader    = 2
	FrameBody      = 3
	FrameHeartbeat = 8
	frameEnd       = 0xCE
)

// Frame sizes. A frame's size counts its payload plus the 8 octets of
// header and end marker, as frame_max does.
const (
	// FrameMinSize is the frame_max in force before connection.tune-ok,
	// and the smallest a peer may negotiate.
	FrameMinSize = 4096
	// frameOverhead is the header (7) plus the end marker (1).
	frameOverhead = 8
)

// ProtocolHeader is what an AMQP 0-9-1 client sends first.
var ProtocolHeader = []byte{'A', 'M', 'Q', 'P', 0, 0, 9, 1}

// Frame is one frame read by a [Reader]. Payload aliases the reader's
// buffer and is valid until the next ReadFrame.
type Frame struct {
	Type    uint8
	Channel uint16
	Payload []byte
}

// Reader reads frames, refusing any larger than its frame_max before it
// reads the payload, so that a peer cannot make it allocate more.
type Reader struct {
	r        io.Reader
	frameMax uint32
	hdr      [7]byte
	buf      []byte
}

// NewReader returns a Reader with frame_max [FrameMinSize]; raise it with
// [Reader.SetFrameMax] once tune-ok has agreed a larger one.
func NewReader(r io.Reader) *Reader {
	if _, ok := r.(io.ByteReader); !ok {
		r = bufio.NewReaderSize(r, 32<<10)
	}
	return &Reader{r: r, frameMax: FrameMinSize}
}

// SetFrameMax sets the largest frame accepted, header and end included.
func (r *Reader) SetFrameMax(n uint32) {
	if n < FrameMinSize {
		n = FrameMinSize
	}
	r.frameMax = n
}

// ReadFrame reads the next frame. A frame of unknown type, larger than
// frame_max, without its end marker or a heartbeat on a channel other than
// 0 is an [*Error] with code 501 (frame error); a read error is returned
// as it is (io.EOF, a timeout), and io.ErrUnexpectedEOF in mid-frame.
func (r *Reader) ReadFrame() (Frame, error) {
	if _, err := io.ReadFull(r.r, r.hdr[:]); err != nil {
		return Frame{}, err
	}
	f := Frame{Type: r.hdr[0], Channel: binary.BigEndian.Uint16(r.hdr[1:3])}
	size := binary.BigEndian.Uint32(r.hdr[3:7])
	switch f.Type {
	case FrameMethod, FrameHeader, FrameBody, FrameHeartbeat:
	default:
		return Frame{}, &Error{Code: FrameError, Text: fmt.Sprintf("unknown frame type %d", f.Type)}
	}
	if uint64(size)+frameOverhead > uint64(r.frameMax) {
		return Frame{}, &Error{Code: FrameError, Cause: ErrFrameTooLarge,
			Text: fmt.Sprintf("frame of %d octets is larger than frame_max %d", uint64(size)+frameOverhead, r.frameMax)}
	}
	n := int(size) + 1
	if cap(r.buf) < n {
		r.buf = make([]byte, n)
	}
	b := r.buf[:n]
	if _, err := io.ReadFull(r.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	if b[size] != frameEnd {
		return Frame{}, &Error{Code: FrameError, Text: fmt.Sprintf("frame end octet is %#x, not 0xce", b[size])}
	}
	f.Payload = b[:size]
	if f.Type == FrameHeartbeat && (f.Channel != 0 || size != 0) {
		return Frame{}, &Error{Code: FrameError, Text: "heartbeat frame on a channel or with a payload"}
	}
	return f, nil
}

// appendFrame appends a frame whose payload fill appends.
func appendFrame(b []byte, typ uint8, channel uint16, fill func([]byte) ([]byte, error)) ([]byte, error) {
	start := len(b)
	b = append(b, typ, byte(channel>>8), byte(channel), 0, 0, 0, 0)
	b, err := fill(b)
	if err != nil {
		return b[:start], err
	}
	binary.BigEndian.PutUint32(b[start+3:], uint32(len(b)-start-7))
	return append(b, frameEnd), nil
}

// AppendMethod appends a method frame on channel to b.
func AppendMethod(b []byte, channel uint16, m Method) ([]byte, error) {
	return appendFrame(b, FrameMethod, channel, func(b []byte) ([]byte, error) {
		return AppendMethodPayload(b, m)
	})
}

// AppendHeartbeat appends a heartbeat frame to b.
func AppendHeartbeat(b []byte) []byte {
	return append(b, FrameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd)
}

// AppendContent appends the content header frame with props and the body
// frames that carry body, each frame at most frameMax octets, to b. It
// follows a method for which HasContent is true.
func AppendContent(b []byte, channel uint16, props *Properties, body []byte, frameMax uint32) ([]byte, error) {
	if frameMax < FrameMinSize {
		frameMax = FrameMinSize
	}
	start := len(b)
	b, err := appendFrame(b, FrameHeader, channel, func(b []byte) ([]byte, error) {
		return appendHeaderPayload(b, uint64(len(body)), props)
	})
	if err != nil {
		return b, err
	}
	if hdr := len(b) - start; hdr > int(frameMax) {
		return b[:start], fmt.Errorf("content header of %d octets: %w", hdr, ErrFrameTooLarge)
	}
	chunk := int(frameMax - frameOverhead)
	for len(body) > 0 {
		n := min(chunk, len(body))
		b = append(b, FrameBody, byte(channel>>8), byte(channel))
		b = binary.BigEndian.AppendUint32(b, uint32(n))
		b = append(b, body[:n]...)
		b = append(b, frameEnd)
		body = body[n:]
	}
	return b, nil
}
