package broker

import (
	"sync"
	"testing"
)

func TestSlotTableReuseWithGenerations(t *testing.T) {
	var tab slotTable
	a := fakeMember("c1.1")
	id1, ok := tab.put(slot{a: a, reqID: 1}, 5)
	if !ok || id1 == 0 {
		t.Fatalf("put = %#x, %v", id1, ok)
	}
	if id1&(shards-1) != 5 {
		t.Fatalf("id %#x does not carry shard 5", id1)
	}
	if sl, ok := tab.get(id1, false); !ok || sl.reqID != 1 || sl.a != a {
		t.Fatalf("get(%#x) = %+v, %v", id1, sl, ok)
	}
	if _, ok := tab.get(id1, true); !ok {
		t.Fatal("remove of a live slot failed")
	}
	if _, ok := tab.get(id1, false); ok {
		t.Fatal("a removed id still finds its slot")
	}

	// The freed slot is reused under a new generation: the old id misses.
	id2, _ := tab.put(slot{a: a, reqID: 2}, 5)
	if id2 == id1 {
		t.Fatalf("reused slot got the same id %#x", id2)
	}
	if uint32(id2) != uint32(id1) || id2>>32 != id1>>32+1 {
		t.Fatalf("id %#x after %#x: want the same index, next generation", id2, id1)
	}
	if _, ok := tab.get(id1, true); ok {
		t.Fatal("a stale id removed the slot that reused its index")
	}
	if sl, ok := tab.get(id2, false); !ok || sl.reqID != 2 {
		t.Fatalf("the new slot is gone after a stale remove: %+v, %v", sl, ok)
	}

	// Many cycles reuse one slot; every id is new and only the last lives.
	seen := map[uint64]bool{id1: true, id2: true}
	tab.get(id2, true)
	var last uint64
	for i := range 10000 {
		id, _ := tab.put(slot{a: a, reqID: uint64(i)}, 5)
		if seen[id] {
			t.Fatalf("cycle %d: id %#x handed out twice", i, id)
		}
		seen[id] = true
		if i < 9999 {
			tab.get(id, true)
		}
		last = id
	}
	if n := len(tab.shard[5].slots); n != 1 {
		t.Fatalf("shard holds %d slots after sequential reuse, want 1", n)
	}
	for id := range seen {
		if _, ok := tab.get(id, false); ok != (id == last) {
			t.Fatalf("id %#x live=%v, want only the last id live", id, ok)
		}
	}
}

func TestSlotTableTakeAttachment(t *testing.T) {
	var tab slotTable
	a, b := fakeMember("c1.1"), fakeMember("c1.2")
	var ofA, ofB []uint64
	for i := range 20 {
		ida, _ := tab.put(slot{a: a, reqID: uint64(i)}, uint64(i))
		idb, _ := tab.put(slot{a: b, reqID: uint64(i)}, uint64(i))
		ofA, ofB = append(ofA, ida), append(ofB, idb)
	}
	if got := tab.takeAttachment(a); len(got) != 20 {
		t.Fatalf("took %d slots of a, want 20", len(got))
	}
	for i := range 20 {
		if _, ok := tab.get(ofA[i], false); ok {
			t.Fatalf("slot %#x of a survived", ofA[i])
		}
		if _, ok := tab.get(ofB[i], false); !ok {
			t.Fatalf("slot %#x of b was taken", ofB[i])
		}
	}
	if got := tab.takeAttachment(a); len(got) != 0 {
		t.Fatalf("took %d slots of a twice", len(got))
	}
	// The freed slots are reused, and a's stale ids miss them.
	for i := range 20 {
		id, _ := tab.put(slot{a: b, reqID: 100 + uint64(i)}, uint64(i))
		if id == ofA[i] {
			t.Fatalf("reused id %#x", id)
		}
	}
	for _, id := range ofA {
		if _, ok := tab.get(id, true); ok {
			t.Fatalf("stale id %#x found a reused slot", id)
		}
	}
}

func TestSlotTableDrain(t *testing.T) {
	var tab slotTable
	a := fakeMember("c1.1")
	var ids []uint64
	for i := range 10 {
		id, _ := tab.put(slot{a: a, reqID: uint64(i)}, uint64(i))
		ids = append(ids, id)
	}
	tab.get(ids[3], true)
	if got := tab.drain(); len(got) != 9 {
		t.Fatalf("drain gave %d slots, want 9", len(got))
	}
	if _, ok := tab.put(slot{a: a}, 0); ok {
		t.Fatal("put succeeded after drain")
	}
	if _, ok := tab.get(ids[0], false); ok {
		t.Fatal("get found a slot after drain")
	}
}

func TestSlotTableConcurrent(t *testing.T) {
	var tab slotTable
	a := fakeMember("c1.1")
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				id, ok := tab.put(slot{a: a, reqID: uint64(g*1_000_000 + i)}, uint64(i))
				if !ok {
					t.Error("put failed")
					return
				}
				sl, ok := tab.get(id, true)
				if !ok || sl.reqID != uint64(g*1_000_000+i) {
					t.Errorf("get(%#x) = %+v, %v: another goroutine's slot", id, sl, ok)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := tab.drain(); len(got) != 0 {
		t.Fatalf("%d slots left", len(got))
	}
}
