package amqp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// seedFrames returns the fuzz seeds: a whole client conversation, and one
// method frame of every method.
func seedFrames(tb testing.TB) [][]byte {
	tb.Helper()
	must := func(b []byte, err error) []byte {
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	var conv []byte
	conv = must(AppendMethod(conv, 0, &ConnectionStartOK{
		ClientProperties: Table{"product": "seed", "capabilities": Table{"basic.nack": true, "consumer_cancel_notify": true}},
		Mechanism:        "PLAIN", Response: "\x00guest\x00guest", Locale: "en_US"}))
	conv = must(AppendMethod(conv, 0, &ConnectionTuneOK{ChannelMax: 2047, FrameMax: 131072, Heartbeat: 10}))
	conv = must(AppendMethod(conv, 0, &ConnectionOpen{VirtualHost: "/"}))
	conv = must(AppendMethod(conv, 1, &ChannelOpen{}))
	conv = must(AppendMethod(conv, 1, &QueueDeclare{Queue: "q", Durable: true, Arguments: Table{"x-max-length": int32(10), "x-queue-type": "quorum"}}))
	conv = must(AppendMethod(conv, 1, &BasicPublish{RoutingKey: "q", Mandatory: true}))
	conv = must(AppendContent(conv, 1, &Properties{ContentType: "text/plain", DeliveryMode: 2,
		Headers: Table{"n": int64(1), "a": []any{"x", 1.5}}, ReplyTo: "amq.rabbitmq.reply-to"}, []byte("hello"), FrameMinSize))
	conv = AppendHeartbeat(conv)
	conv = must(AppendMethod(conv, 0, &ConnectionClose{ReplyCode: ReplySuccess, ReplyText: "bye"}))
	seeds := [][]byte{conv}
	for i, m := range allMethods() {
		v := reflect.New(reflect.TypeOf(m).Elem())
		fill(v.Elem(), i)
		seeds = append(seeds, must(AppendMethod(nil, uint16(i), v.Interface().(Method))))
	}
	return seeds
}

// FuzzFrame feeds arbitrary bytes to the frame reader as a client's
// conversation after the protocol header, and decodes every method and
// content header it yields. Nothing may panic; every failure must be an
// AMQP exception or a short read; whatever decodes must encode again and
// decode to the same.
func FuzzFrame(f *testing.F) {
	for _, s := range seedFrames(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data))
		r.SetFrameMax(131072)
		for range 64 {
			fr, err := r.ReadFrame()
			if err != nil {
				checkErr(t, err)
				return
			}
			switch fr.Type {
			case FrameMethod:
				m, err := DecodeMethod(fr.Payload)
				if err != nil {
					checkErr(t, err)
					continue
				}
				b, err := AppendMethodPayload(nil, m)
				if err != nil {
					t.Fatalf("re-encode %s: %v", m.Name(), err)
				}
				m2, err := DecodeMethod(b)
				if err != nil {
					t.Fatalf("decode re-encoded %s: %v", m.Name(), err)
				}
				if reflect.TypeOf(m2) != reflect.TypeOf(m) {
					t.Fatalf("re-encoded %s decodes as %s", m.Name(), m2.Name())
				}
			case FrameHeader:
				h, err := DecodeHeader(fr.Payload)
				if err != nil {
					checkErr(t, err)
					continue
				}
				if _, err := AppendContent(nil, 1, &h.Properties, nil, 1<<20); err != nil {
					t.Fatalf("re-encode header: %v", err)
				}
			}
		}
	})
}

func checkErr(t *testing.T, err error) {
	t.Helper()
	var ae *Error
	switch {
	case errors.As(err, &ae):
		if ae.Code < FrameError || ae.Code > UnexpectedFrame {
			t.Fatalf("codec error with code %d: %v", ae.Code, err)
		}
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
	default:
		t.Fatalf("unexpected error type %T: %v", err, err)
	}
}

// TestWriteFuzzCorpus rewrites testdata/fuzz/FuzzFrame from seedFrames
// when AMQP_WRITE_CORPUS=1; otherwise it checks the committed corpus is
// there.
func TestWriteFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzFrame")
	if os.Getenv("AMQP_WRITE_CORPUS") != "1" {
		ents, err := os.ReadDir(dir)
		if err != nil || len(ents) == 0 {
			t.Fatalf("committed seed corpus missing in %s: %v", dir, err)
		}
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seedFrames(t) {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%02d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
