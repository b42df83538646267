package amqp

import (
	"log/slog"
	"testing"

	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

// brokerServer starts a server on a broker with the transient pub-sub
// exchange "ex".
func brokerServer(t *testing.T, cfg Config) string {
	t.Helper()
	b := broker.New(broker.Config{Log: slog.New(slog.DiscardHandler)})
	t.Cleanup(func() { b.Close() })
	if _, err := b.Declare("ex", broker.Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub, Transient: true}}); err != nil {
		t.Fatal(err)
	}
	cfg.Broker = b
	_, url := startServer(t, cfg)
	return url
}

func (rc *rawClient) content(channel uint16, props *Properties, body []byte, size uint64, frameMax uint32) {
	rc.t.Helper()
	b, err := AppendContent(nil, channel, props, body, frameMax)
	if err != nil {
		rc.t.Fatal(err)
	}
	if size != uint64(len(body)) {
		// Rewrite the announced size (the u64 after class and weight).
		for i := range 8 {
			b[7+4+i] = byte(size >> (56 - 8*i))
		}
	}
	rc.write(b)
}

// wantChannelClose reads until channel.close on channel, checks its code
// and answers close-ok.
func (rc *rawClient) wantChannelClose(channel uint16, code uint16) {
	rc.t.Helper()
	for {
		m := rc.next()
		cl, ok := m.(*ChannelClose)
		if !ok {
			continue
		}
		if cl.ReplyCode != code {
			rc.t.Fatalf("channel.close %d %q, want %d", cl.ReplyCode, cl.ReplyText, code)
		}
		rc.method(channel, &ChannelCloseOK{})
		return
	}
}

func TestPublishContentFrames(t *testing.T) {
	url := brokerServer(t, Config{MaxMessage: 10000})
	t.Run("body in many frames, confirmed", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.open(0)
		rc.method(1, &ConfirmSelect{})
		if _, ok := rc.next().(*ConfirmSelectOK); !ok {
			t.Fatal("no select-ok")
		}
		for range 2 {
			rc.method(1, &BasicPublish{Exchange: "ex", RoutingKey: "k"})
			rc.content(1, &Properties{ContentType: "a/b"}, make([]byte, 9000), 9000, FrameMinSize)
		}
		rc.method(1, &BasicPublish{Exchange: "ex", RoutingKey: "k"})
		rc.content(1, &Properties{}, nil, 0, FrameMinSize) // an empty body: no body frame
		for tag := uint64(1); tag <= 3; tag++ {
			ack, ok := rc.next().(*BasicAck)
			if !ok || ack.DeliveryTag != tag {
				t.Fatalf("want basic.ack %d, got %+v", tag, ack)
			}
		}
	})
	t.Run("message over the limit closes the channel", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.open(0)
		rc.method(1, &BasicPublish{Exchange: "ex", RoutingKey: "k"})
		rc.content(1, &Properties{}, make([]byte, 10001), 10001, FrameMinSize)
		rc.wantChannelClose(1, PreconditionFailed)
		// The connection lives on: channel 1 opens again.
		rc.method(1, &ChannelOpen{})
		if _, ok := rc.next().(*ChannelOpenOK); !ok {
			t.Fatal("channel 1 does not open again")
		}
	})
	for _, tc := range []struct {
		name string
		send func(rc *rawClient)
		code uint16
	}{
		{"body longer than announced", func(rc *rawClient) {
			rc.method(1, &BasicPublish{Exchange: "ex"})
			rc.content(1, &Properties{}, make([]byte, 100), 50, FrameMinSize)
		}, FrameError},
		{"method before the content", func(rc *rawClient) {
			rc.method(1, &BasicPublish{Exchange: "ex"})
			rc.method(1, &BasicQos{})
		}, UnexpectedFrame},
		{"body before the header", func(rc *rawClient) {
			rc.method(1, &BasicPublish{Exchange: "ex"})
			rc.write([]byte{FrameBody, 0, 1, 0, 0, 0, 1, 'x', frameEnd})
		}, UnexpectedFrame},
		{"header of another class", func(rc *rawClient) {
			rc.method(1, &BasicPublish{Exchange: "ex"})
			rc.write([]byte{FrameHeader, 0, 1, 0, 0, 0, 14, 0, 50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, frameEnd})
		}, UnexpectedFrame},
		{"malformed header", func(rc *rawClient) {
			rc.method(1, &BasicPublish{Exchange: "ex"})
			rc.write([]byte{FrameHeader, 0, 1, 0, 0, 0, 3, 0, 60, 0, frameEnd})
		}, SyntaxError},
		{"header without publish", func(rc *rawClient) {
			rc.content(1, &Properties{}, nil, 0, FrameMinSize)
		}, UnexpectedFrame},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := rawDial(t, url)
			rc.open(0)
			tc.send(rc)
			rc.wantClose(tc.code)
		})
	}
	t.Run("unfinished publications bounded per connection", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.open(0)
		// Three channels each with 9000 of 10000 octets: over twice the
		// 10000-octet limit on the third.
		for ch := uint16(1); ch <= 3; ch++ {
			if ch > 1 {
				rc.method(ch, &ChannelOpen{})
				if _, ok := rc.next().(*ChannelOpenOK); !ok {
					t.Fatal("no channel.open-ok")
				}
			}
			rc.method(ch, &BasicPublish{Exchange: "ex"})
			b, err := AppendContent(nil, ch, &Properties{}, make([]byte, 9000), FrameMinSize)
			if err != nil {
				t.Fatal(err)
			}
			// The content header says 10000: the body stays unfinished.
			for i := range 8 {
				b[7+4+i] = byte(uint64(10000) >> (56 - 8*i))
			}
			rc.write(b)
		}
		rc.wantClose(ResourceError)
	})
	t.Run("user-id of another user", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.open(0)
		rc.method(1, &BasicPublish{Exchange: "ex"})
		rc.content(1, &Properties{UserID: "mallory"}, []byte("x"), 1, FrameMinSize)
		rc.wantChannelClose(1, PreconditionFailed)
	})
	t.Run("frames on a closing channel are dropped", func(t *testing.T) {
		rc := rawDial(t, url)
		rc.open(0)
		rc.method(1, &BasicPublish{Exchange: "nope"})
		rc.content(1, &Properties{}, []byte("x"), 1, FrameMinSize)
		// Before reading the close: more on the closing channel.
		rc.method(1, &BasicPublish{Exchange: "ex"})
		rc.content(1, &Properties{}, []byte("y"), 1, FrameMinSize)
		rc.wantChannelClose(1, NotFound)
		rc.method(1, &ChannelOpen{})
		if _, ok := rc.next().(*ChannelOpenOK); !ok {
			t.Fatal("channel 1 does not open again")
		}
	})
}

func TestPropsToHeaders(t *testing.T) {
	h := propsToHeaders(&Properties{
		Headers:     Table{"a": int64(1), "b": []byte("x"), "c": Table{"d": true}, "content-type": int32(3), "expiration": int8(9), "x-amqp-types": "spoofed", "x-amqp-exchange": "spoofed", "x-amqp-routing-key": "spoofed"},
		ContentType: "text/plain", Priority: 5, ReplyTo: "r",
	})
	// The types of the headers that are not strings; a property wins
	// over a header of its name, with its own type; a header of a
	// property's name the message does not set keeps its type.
	want := map[string]string{"a": "1", "b": "x", "c": `{"d":true}`, "content-type": "text/plain", "priority": "5", "reply-to": "r", "expiration": "9",
		"x-amqp-types": `{"a":"int","b":"bytes","c":"table","expiration":"int","priority":"int"}`}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s = %q, want %q", k, h[k], v)
		}
	}
	if len(h) != len(want) {
		t.Errorf("headers %v", h)
	}
	if propsToHeaders(&Properties{}) != nil {
		t.Error("no properties give headers")
	}
}

// FuzzHeadersToProps: the headers of a message, x-amqp-types included,
// come from any publisher: whatever they hold, they become properties
// and a headers table that encode as a content header, and the types
// header is never shown.
func FuzzHeadersToProps(f *testing.F) {
	f.Add("n", "7", `{"n":"int"}`)
	f.Add("n", "x", `{"n":"int"}`)
	f.Add("t", "1700000000", `{"t":"timestamp"}`)
	f.Add("b", "maybe", `{"b":"bool","f":"float"}`)
	f.Add("v", "", `{"v":"void"}`)
	f.Add("priority", "300", `{`)
	f.Fuzz(func(t *testing.T, name, value, types string) {
		h := map[string]string{name: value, "x-amqp-types": types}
		p := headersToProps(h)
		if _, err := AppendContent(nil, 1, p, nil, FrameMinSize); err != nil {
			t.Fatalf("%q=%q with types %q: %v", name, value, types, err)
		}
		if _, ok := p.Headers["x-amqp-types"]; ok {
			t.Fatal("the types header is shown")
		}
	})
}
