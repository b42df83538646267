package amqp

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

// allMethods returns one zero value of every method the codec knows.
func allMethods() []Method {
	var ms []Method
	for class := uint16(0); class < 100; class++ {
		for id := uint16(0); id < 130; id++ {
			if m := newMethod(class, id); m != nil {
				ms = append(ms, m)
			}
		}
	}
	return ms
}

// fill sets every field of the method struct at v to a value that depends
// on seed, so that a field read into the wrong place shows.
func fill(v reflect.Value, seed int) {
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		s := seed + i
		switch f.Kind() {
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			f.SetUint(uint64(s*37 + 1))
		case reflect.String:
			f.SetString(strings.Repeat(string(rune('a'+s%26)), s%7+1))
		case reflect.Bool:
			f.SetBool(s%2 == 1)
		case reflect.Map:
			f.Set(reflect.ValueOf(Table{"k": int32(s), "nested": Table{"b": true}}))
		default:
			panic("unexpected kind " + f.Kind().String())
		}
	}
}

func TestMethodRoundTrip(t *testing.T) {
	ms := allMethods()
	if len(ms) != 64 {
		t.Fatalf("codec knows %d methods, want 64", len(ms))
	}
	for _, m := range ms {
		for seed := range 3 {
			t.Run(m.Name(), func(t *testing.T) {
				want := reflect.New(reflect.TypeOf(m).Elem())
				fill(want.Elem(), seed)
				b, err := AppendMethod(nil, 7, want.Interface().(Method))
				if err != nil {
					t.Fatal(err)
				}
				r := NewReader(bytes.NewReader(b))
				f, err := r.ReadFrame()
				if err != nil {
					t.Fatal(err)
				}
				if f.Type != FrameMethod || f.Channel != 7 {
					t.Fatalf("frame type %d channel %d", f.Type, f.Channel)
				}
				got, err := DecodeMethod(f.Payload)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want.Interface()) {
					t.Fatalf("got %+v\nwant %+v", got, want.Interface())
				}
			})
		}
	}
}

// TestKnownBytes checks the codec against frames written out by hand from
// the specification, so that a symmetric mistake in encode and decode shows.
func TestKnownBytes(t *testing.T) {
	cases := []struct {
		name string
		m    Method
		wire []byte
	}{
		{"basic.ack multiple", &BasicAck{DeliveryTag: 5, Multiple: true},
			[]byte{0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 5, 1}},
		{"basic.nack requeue only", &BasicNack{DeliveryTag: 1, Requeue: true},
			[]byte{0, 60, 0, 120, 0, 0, 0, 0, 0, 0, 0, 1, 2}},
		{"queue.declare durable auto-delete", &QueueDeclare{Queue: "q", Durable: true, AutoDelete: true, Arguments: Table{}},
			[]byte{0, 50, 0, 10, 0, 0, 1, 'q', 0b01010, 0, 0, 0, 0}},
		{"connection.tune", &ConnectionTune{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 60},
			[]byte{0, 10, 0, 30, 0x07, 0xff, 0, 2, 0, 0, 0, 60}},
		{"exchange.unbind-ok", &ExchangeUnbindOK{}, []byte{0, 40, 0, 51}},
		{"basic.publish mandatory", &BasicPublish{Exchange: "x", RoutingKey: "k", Mandatory: true},
			[]byte{0, 60, 0, 40, 0, 0, 1, 'x', 1, 'k', 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendMethodPayload(nil, tc.m)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, tc.wire) {
				t.Fatalf("encoded % x\nwant    % x", b, tc.wire)
			}
			got, err := DecodeMethod(tc.wire)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.m) {
				t.Fatalf("decoded %+v, want %+v", got, tc.m)
			}
		})
	}
}

func TestTableEveryType(t *testing.T) {
	ts := time.Unix(1700000000, 0).UTC()
	in := Table{
		"bool": true, "i8": int8(-3), "u8": uint8(200), "i16": int16(-300), "u16": uint16(60000),
		"i32": int32(-70000), "u32": uint32(4000000000), "i64": int64(-1 << 40),
		"f32": float32(1.5), "f64": 2.25, "dec": Decimal{Scale: 2, Value: 12345},
		"str": "héllo", "bytes": []byte{0, 1, 2}, "time": ts, "void": nil,
		"arr": []any{int32(1), "two", []any{false}, Table{"x": int64(3)}},
		"tbl": Table{"capabilities": Table{"publisher_confirms": true}},
	}
	e := encoder{}
	e.table(in)
	if e.err != nil {
		t.Fatal(e.err)
	}
	d := decoder{b: e.b}
	out := d.table()
	if err := d.done(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("got %#v\nwant %#v", out, in)
	}
	// int and map[string]any encode as l and F.
	e = encoder{}
	e.table(Table{"n": 7, "m": map[string]any{"a": "b"}})
	d = decoder{b: e.b}
	out = d.table()
	if want := (Table{"n": int64(7), "m": Table{"a": "b"}}); !reflect.DeepEqual(out, want) {
		t.Fatalf("got %#v, want %#v", out, want)
	}
}

func TestTableErrors(t *testing.T) {
	deep := Table{}
	for range MaxTableDepth {
		deep = Table{"d": deep}
	}
	cases := []struct {
		name string
		wire []byte
		want error
	}{
		{"unknown type", []byte{0, 0, 0, 3, 1, 'k', 'Z'}, ErrFieldType},
		{"length past end", []byte{0, 0, 0, 9, 1, 'k'}, ErrShort},
		{"value cut short", []byte{0, 0, 0, 4, 1, 'k', 'I', 0}, ErrShort},
		{"long string past table", []byte{0, 0, 0, 7, 1, 'k', 'S', 0, 0, 0, 9}, ErrShort},
		{"too deep", encodeRaw(t, deep), ErrTableDepth},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := decoder{b: tc.wire}
			d.table()
			if err := d.done(); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
	e := encoder{}
	e.table(Table{"c": make(chan int)})
	if !errors.Is(e.err, ErrValueType) {
		t.Fatalf("encoding a channel: %v", e.err)
	}
	e = encoder{}
	e.table(Table{"d": deep})
	if !errors.Is(e.err, ErrTableDepth) {
		t.Fatalf("encoding too deep: %v", e.err)
	}
}

// encodeRaw encodes a table nested deeper than the encoder allows, by
// writing its innermost level first.
func encodeRaw(t *testing.T, tb Table) []byte {
	t.Helper()
	inner := []byte{0, 0, 0, 0}
	for v := tb; ; {
		next, ok := v["d"].(Table)
		if !ok {
			break
		}
		var b []byte
		b = append(b, 0, 0, 0, byte(len(inner)+3), 1, 'd', 'F')
		b = append(b, inner...)
		inner = b
		v = next
	}
	return inner
}

func TestContentRoundTrip(t *testing.T) {
	props := Properties{
		ContentType: "text/plain", ContentEncoding: "gzip", Headers: Table{"h": "v"},
		DeliveryMode: 2, Priority: 9, CorrelationID: "c1", ReplyTo: "amq.rabbitmq.reply-to",
		Expiration: "60000", MessageID: "m1", Timestamp: time.Unix(1700000000, 0).UTC(),
		Type: "t", UserID: "guest", AppID: "app", ClusterID: "cl",
	}
	body := bytes.Repeat([]byte("0123456789"), 1000) // 10000 octets: 3 body frames at 4096
	b, err := AppendContent(nil, 3, &props, body, FrameMinSize)
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(bytes.NewReader(b))
	f, err := r.ReadFrame()
	if err != nil || f.Type != FrameHeader || f.Channel != 3 {
		t.Fatalf("header frame %+v, %v", f, err)
	}
	h, err := DecodeHeader(f.Payload)
	if err != nil {
		t.Fatal(err)
	}
	if h.ClassID != ClassBasic || h.BodySize != uint64(len(body)) || !reflect.DeepEqual(h.Properties, props) {
		t.Fatalf("header %+v", h)
	}
	var got []byte
	frames := 0
	for {
		f, err := r.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil || f.Type != FrameBody {
			t.Fatalf("body frame %+v, %v", f, err)
		}
		if len(f.Payload)+frameOverhead > FrameMinSize {
			t.Fatalf("body frame of %d octets exceeds frame_max", len(f.Payload))
		}
		got = append(got, f.Payload...)
		frames++
	}
	if frames != 3 || !bytes.Equal(got, body) {
		t.Fatalf("%d body frames, %d octets", frames, len(got))
	}
	// Absent properties stay absent.
	b, _ = AppendContent(nil, 1, &Properties{}, nil, FrameMinSize)
	f, _ = NewReader(bytes.NewReader(b)).ReadFrame()
	if h, err := DecodeHeader(f.Payload); err != nil || !reflect.DeepEqual(h.Properties, Properties{}) {
		t.Fatalf("empty properties: %+v, %v", h, err)
	}
	// A header larger than frame_max is refused rather than sent.
	big := Properties{Headers: Table{"x": strings.Repeat("a", FrameMinSize)}}
	if _, err := AppendContent(nil, 1, &big, nil, FrameMinSize); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized header: %v", err)
	}
}

func TestReaderErrors(t *testing.T) {
	frame := func(typ uint8, ch uint16, payload []byte, end byte) []byte {
		b := []byte{typ, byte(ch >> 8), byte(ch), 0, 0, 0, 0}
		b[3], b[4], b[5], b[6] = byte(len(payload)>>24), byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
		return append(append(b, payload...), end)
	}
	cases := []struct {
		name string
		wire []byte
		code uint16
		err  error
	}{
		{"unknown type", frame(4, 0, nil, frameEnd), FrameError, nil},
		{"bad end", frame(FrameMethod, 0, []byte{0, 10, 0, 51}, 0), FrameError, nil},
		{"heartbeat on a channel", frame(FrameHeartbeat, 1, nil, frameEnd), FrameError, nil},
		{"heartbeat with payload", frame(FrameHeartbeat, 0, []byte{1}, frameEnd), FrameError, nil},
		{"too large", []byte{FrameBody, 0, 1, 0, 0, 0x10, 0}, FrameError, ErrFrameTooLarge},
		{"huge size", []byte{FrameBody, 0, 1, 0xff, 0xff, 0xff, 0xff}, FrameError, ErrFrameTooLarge},
		{"cut payload", []byte{FrameBody, 0, 1, 0, 0, 0, 9, 1, 2}, 0, io.ErrUnexpectedEOF},
		{"cut header", []byte{FrameBody, 0}, 0, io.ErrUnexpectedEOF},
		{"nothing", nil, 0, io.EOF},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewReader(bytes.NewReader(tc.wire)).ReadFrame()
			if tc.code != 0 {
				var ae *Error
				if !errors.As(err, &ae) || ae.Code != tc.code {
					t.Fatalf("err %v, want code %d", err, tc.code)
				}
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
		})
	}
	// frame_max raised by tune-ok admits larger frames.
	r := NewReader(bytes.NewReader(frame(FrameBody, 1, make([]byte, 5000), frameEnd)))
	r.SetFrameMax(131072)
	if f, err := r.ReadFrame(); err != nil || len(f.Payload) != 5000 {
		t.Fatalf("5000-octet body at frame_max 131072: %v", err)
	}
}

func TestDecodeMethodErrors(t *testing.T) {
	cases := []struct {
		name string
		wire []byte
		code uint16
		err  error
	}{
		{"no ids", []byte{0, 10}, FrameError, ErrShort},
		{"unknown class", []byte{0, 99, 0, 10}, CommandInvalid, ErrUnknownMethod},
		{"unknown method", []byte{0, 60, 0, 99}, CommandInvalid, ErrUnknownMethod},
		{"short fields", []byte{0, 60, 0, 80, 0, 0, 0}, SyntaxError, ErrShort},
		{"trailing bytes", []byte{0, 10, 0, 51, 0}, SyntaxError, ErrTrailing},
		{"short string past end", []byte{0, 60, 0, 30, 9, 'a', 0}, SyntaxError, ErrShort},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeMethod(tc.wire)
			var ae *Error
			if !errors.As(err, &ae) || ae.Code != tc.code || !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want code %d and %v", err, tc.code, tc.err)
			}
		})
	}
	if _, err := AppendMethodPayload(nil, &BasicConsumeOK{ConsumerTag: strings.Repeat("x", 256)}); !errors.Is(err, ErrShortString) {
		t.Fatalf("256-octet short string: %v", err)
	}
}

func TestErrorHard(t *testing.T) {
	for code, hard := range map[uint16]bool{NotFound: false, PreconditionFailed: false, AccessRefused: false,
		ResourceLocked: false, ConnectionForced: true, InvalidPath: true, FrameError: true, NotAllowed: true, NotImplemented: true} {
		if got := (&Error{Code: code}).Hard(); got != hard {
			t.Errorf("code %d: Hard() = %v, want %v", code, got, hard)
		}
	}
	if e := AsError(io.EOF); e.Code != InternalError {
		t.Errorf("AsError(EOF) code %d", e.Code)
	}
}
