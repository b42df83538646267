package amqp

import (
	"testing"
)

// Encoding a method frame allocates nothing once the buffer has room,
// and decoding one allocates only the method: the codecs handed to a
// method through the Method interface come from pools (a codec on the
// stack would escape, one allocation per frame each way).
func TestMethodCodecAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under the race detector")
	}
	buf := make([]byte, 0, 4096)
	deliver := &BasicDeliver{ConsumerTag: "amq.ctag-1", DeliveryTag: 7, RoutingKey: "jobs"}
	enc := testing.AllocsPerRun(200, func() {
		b, err := AppendMethod(buf[:0], 1, deliver)
		if err != nil || len(b) == 0 {
			t.Fatalf("AppendMethod: %v", err)
		}
	})
	if enc != 0 {
		t.Errorf("AppendMethod(basic.deliver): %.1f allocations, want 0", enc)
	}

	payload, err := AppendMethodPayload(nil, &BasicAck{DeliveryTag: 9, Multiple: true})
	if err != nil {
		t.Fatal(err)
	}
	dec := testing.AllocsPerRun(200, func() {
		m, err := DecodeMethod(payload)
		if err != nil {
			t.Fatalf("DecodeMethod: %v", err)
		}
		if a := m.(*BasicAck); a.DeliveryTag != 9 || !a.Multiple {
			t.Fatalf("decoded %+v", a)
		}
	})
	if dec != 1 {
		t.Errorf("DecodeMethod(basic.ack): %.1f allocations, want 1 (the method)", dec)
	}
}

// A pooled codec goes back cleared: a failed encode or decode leaves no
// sticky error for the next one.
func TestMethodCodecPoolReuse(t *testing.T) {
	if _, err := DecodeMethod([]byte{0, 60, 0, 80, 1}); err == nil {
		t.Fatal("DecodeMethod of a short basic.ack: no error")
	}
	payload, err := AppendMethodPayload(nil, &BasicAck{DeliveryTag: 3})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		m, err := DecodeMethod(payload)
		if err != nil {
			t.Fatalf("DecodeMethod after a failure: %v", err)
		}
		if m.(*BasicAck).DeliveryTag != 3 {
			t.Fatalf("decoded %+v", m)
		}
	}
}

// ttlTag turns the expiration property into the SUBMIT tag, and an
// absent one costs nothing.
func TestTTLTag(t *testing.T) {
	for in, want := range map[string]string{"": "", "1500": "ttl=1500", "0": "ttl=0", "soon": "", "-1": ""} {
		if got := ttlTag(in); got != want {
			t.Errorf("ttlTag(%q) = %q, want %q", in, got, want)
		}
	}
	if raceEnabled {
		return
	}
	if n := testing.AllocsPerRun(100, func() { _ = ttlTag("") }); n != 0 {
		t.Errorf("ttlTag(\"\"): %.1f allocations, want 0", n)
	}
}
