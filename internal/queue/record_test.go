package queue

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

func TestEnqueueRecordRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    message
	}{
		{"empty", message{id: 1}},
		{"full", message{id: 1 << 40, prio: MaxPriority, enqueued: 1, due: 2, expires: -3, key: "order-42",
			headers: map[string]string{"traceparent": "00-1-2-01", "": "empty name", "big": strings.Repeat("v", 70000)},
			body:    []byte("payload")}},
		{"binary body", message{id: 7, body: []byte{0, 1, 2, 0xff}}},
		{"dedup", message{id: 8, key: "k", headers: map[string]string{"a": "b"}, body: []byte("x"),
			dk: &dedupEntry{key: dedupKey{"producer-1", 1<<63 + 5}}}},
		{"dedup longest producer", message{id: 9, dk: &dedupEntry{key: dedupKey{strings.Repeat("p", MaxProducerLen), 1}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := appendEnqueue(nil, &tc.m)
			r, err := decodeEnqueue(p)
			must(t, err)
			if r.id != tc.m.id || r.prio != tc.m.prio || r.enqueued != tc.m.enqueued || r.due != tc.m.due ||
				r.expires != tc.m.expires || r.key != tc.m.key || string(r.body) != string(tc.m.body) ||
				!maps.Equal(r.headers, tc.m.headers) {
				t.Fatalf("decoded %+v", r)
			}
			wantV := byte(recordVersion)
			if tc.m.dk != nil {
				wantV = recordVersionDedup
				if r.producer != tc.m.dk.key.producer || r.seq != tc.m.dk.key.seq {
					t.Fatalf("decoded pair (%q, %d), want %v", r.producer, r.seq, tc.m.dk.key)
				}
			} else if r.producer != "" || r.seq != 0 {
				t.Fatalf("decoded pair (%q, %d) from a version 1 record", r.producer, r.seq)
			}
			if p[0] != wantV {
				t.Fatalf("version %d, want %d", p[0], wantV)
			}
		})
	}
}

func TestDecodeRefusesBadRecords(t *testing.T) {
	good := appendEnqueue(nil, &message{id: 3, key: "k", headers: map[string]string{"a": "b"}, body: []byte("x")})
	for _, tc := range []struct {
		name string
		p    []byte
	}{
		{"short", good[:10]},
		{"version", append([]byte{9}, good[1:]...)},
		{"priority", append([]byte{recordVersion, 10}, good[2:]...)},
		{"key past the end", good[:enqueueFixed]},
		{"header past the end", good[:enqueueFixed+1+3]},
		{"id 0", append(append([]byte{}, good[:8]...), append(make([]byte, 8), good[16:]...)...)},
		{"v2 without producer", append([]byte{recordVersionDedup}, good[1:enqueueFixed]...)},
		{"v2 empty producer", append(append([]byte{recordVersionDedup}, good[1:enqueueFixed]...), 0, 1, 0, 0, 0, 0, 0, 0, 0)},
		{"v2 producer past the end", append(append([]byte{recordVersionDedup}, good[1:enqueueFixed]...), 3, 'a', 'b')},
		{"v2 seq 0", append(append([]byte{recordVersionDedup}, good[1:enqueueFixed]...), 1, 'a', 0, 0, 0, 0, 0, 0, 0, 0, 'k', 0, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeEnqueue(tc.p); !errors.Is(err, errBadRecord) {
				t.Fatalf("got %v, want errBadRecord", err)
			}
		})
	}
	if _, err := decodeAttempt(appendAttempt(nil, 1, 2, 3)[:20]); !errors.Is(err, errBadRecord) {
		t.Fatalf("short attempt: %v", err)
	}
	if _, err := decodeAttempt(appendAttempt(nil, 0, 2, 3)); !errors.Is(err, errBadRecord) {
		t.Fatalf("attempt of id 0: %v", err)
	}
	a, err := decodeAttempt(appendAttempt(nil, 5, 6, -7))
	if err != nil || a != (attemptRecord{id: 5, attempts: 6, due: -7}) {
		t.Fatalf("attempt round trip: %+v %v", a, err)
	}
}

func FuzzDecodeEnqueue(f *testing.F) {
	f.Add(appendEnqueue(nil, &message{id: 1}))
	f.Add(appendEnqueue(nil, &message{id: 9, prio: 4, key: "k", headers: map[string]string{"a": "b", "c": ""}, body: []byte("body")}))
	f.Add(appendAttempt(nil, 1, 2, 3))
	f.Add(appendEnqueue(nil, &message{id: 5, key: "k", body: []byte("b"), dk: &dedupEntry{key: dedupKey{"p", 7}}}))
	f.Fuzz(func(t *testing.T, p []byte) {
		r, err := decodeEnqueue(p)
		if err != nil {
			return
		}
		// What decodes re-encodes to a record that decodes the same
		// (header order aside).
		m := message{id: r.id, prio: r.prio, enqueued: r.enqueued, due: r.due, expires: r.expires, key: r.key, headers: r.headers, body: r.body}
		if r.producer != "" {
			m.dk = &dedupEntry{key: dedupKey{r.producer, r.seq}}
		}
		r2, err := decodeEnqueue(appendEnqueue(nil, &m))
		if err != nil {
			t.Fatalf("re-encoded record does not decode: %v", err)
		}
		if r2.id != r.id || r2.key != r.key || string(r2.body) != string(r.body) || !maps.Equal(r2.headers, r.headers) ||
			r2.producer != r.producer || r2.seq != r.seq {
			t.Fatalf("round trip changed the record")
		}
	})
}

func FuzzRebuilder(f *testing.F) {
	f.Add(appendEnqueue(nil, &message{id: 1, body: []byte("x")}), appendAttempt(nil, 1, 1, 5), uint8(3))
	f.Add(appendEnqueue(nil, &message{id: 1, body: []byte("x"), dk: &dedupEntry{key: dedupKey{"p", 3}}}), appendAttempt(nil, 1, 1, 5), uint8(5))
	f.Fuzz(func(t *testing.T, enq, att []byte, ops uint8) {
		// Arbitrary records and releases never make the Rebuilder panic
		// or build an inconsistent queue.
		rb := NewRebuilder()
		refs := []Ref{}
		for i := range int(ops%8) + 1 {
			ref := Ref{Seg: 1, Off: uint32(16 * (i + 1)), Len: 1}
			switch i % 3 {
			case 0:
				rb.Apply(Entry{Ref: ref, Kind: KindEnqueue, Payload: enq})
			case 1:
				rb.Apply(Entry{Ref: ref, Kind: KindAttempt, Payload: att})
			case 2:
				rb.Apply(Entry{Ref: ref, Kind: KindRelease, Released: refs[:len(refs)/2]})
			}
			refs = append(refs, ref)
		}
		e := newEnv(t)
		q, err := rb.Build("q", e.config())
		if err != nil {
			t.Fatal(err)
		}
		if err := q.check(); err != nil {
			t.Fatal(err)
		}
	})
}
