package broker

import (
	"fmt"
	"testing"
)

func ringKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", i)
	}
	return keys
}

func owners(r *ring, keys []string) map[string]*Attachment {
	m := make(map[string]*Attachment, len(keys))
	for _, k := range keys {
		m[k] = r.pick(k)
	}
	return m
}

func TestRingBalance(t *testing.T) {
	var ms []*Attachment
	for i := range 5 {
		ms = append(ms, fakeMember(fmt.Sprintf("c%d.1", i+1)))
	}
	keys := ringKeys(10000)
	share := map[*Attachment]int{}
	for _, o := range owners(newRing(ms), keys) {
		share[o]++
	}
	for _, m := range ms {
		// 2000 each on average; 128 virtual nodes keep every share within
		// a factor of about 1.5.
		if s := share[m]; s < 1200 || s > 2800 {
			t.Errorf("%s owns %d of %d keys", m.member, s, len(keys))
		}
	}
}

func TestRingMinimalMovement(t *testing.T) {
	var ms []*Attachment
	for i := range 5 {
		ms = append(ms, fakeMember(fmt.Sprintf("c%d.1", i+1)))
	}
	keys := ringKeys(10000)
	before := owners(newRing(ms), keys)

	// One leaves: only its keys move, and they spread over the others.
	gone := ms[2]
	rest := append(append([]*Attachment{}, ms[:2]...), ms[3:]...)
	after := owners(newRing(rest), keys)
	moved, to := 0, map[*Attachment]int{}
	for _, k := range keys {
		switch {
		case after[k] == gone:
			t.Fatalf("key %s still on the member that left", k)
		case before[k] == gone:
			moved++
			to[after[k]]++
		case after[k] != before[k]:
			t.Fatalf("key %s moved from %s to %s, neither of which left", k, before[k].member, after[k].member)
		}
	}
	if moved == 0 || len(to) < 2 {
		t.Fatalf("%d keys moved, to %d members: want the leaver's keys spread", moved, len(to))
	}

	// One joins: only keys that go to it move.
	joined := fakeMember("c9.1")
	grown := owners(newRing(append(append([]*Attachment{}, ms...), joined)), keys)
	took := 0
	for _, k := range keys {
		switch {
		case grown[k] == joined:
			took++
		case grown[k] != before[k]:
			t.Fatalf("key %s moved from %s to %s when %s joined", k, before[k].member, grown[k].member, joined.member)
		}
	}
	if took < 1000 || took > 2500 {
		t.Fatalf("the new member took %d of %d keys, want about a sixth", took, len(keys))
	}

	// Member order does not matter.
	rev := make([]*Attachment, len(ms))
	for i, m := range ms {
		rev[len(ms)-1-i] = m
	}
	again := owners(newRing(rev), keys)
	for _, k := range keys {
		if again[k] != before[k] {
			t.Fatalf("key %s moved when only the member order changed", k)
		}
	}
}

func TestRingConnTagIdentity(t *testing.T) {
	a := &Attachment{member: "c1.1", connTag: "worker-a"}
	b := &Attachment{member: "c2.1", connTag: "worker-b"}
	keys := ringKeys(2000)
	before := owners(newRing([]*Attachment{a, b}), keys)
	// worker-a restarts with a new member id and the same tag: it gets its
	// keys back.
	a2 := &Attachment{member: "c7.4", connTag: "worker-a"}
	after := owners(newRing([]*Attachment{a2, b}), keys)
	for _, k := range keys {
		want := before[k]
		if want == a {
			want = a2
		}
		if after[k] != want {
			t.Fatalf("key %s went to %s, want %s", k, after[k].member, want.member)
		}
	}
}

func TestRingOne(t *testing.T) {
	a := fakeMember("c1.1")
	r := newRing([]*Attachment{a})
	for _, k := range []string{"", "x", "a.b.c"} {
		if r.pick(k) != a {
			t.Fatalf("key %q not on the only member", k)
		}
	}
}
