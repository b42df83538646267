package broker

import "testing"

// TestForwardTableBounds: forwarded submits are found once by node and
// id, all of a node's go when it does, and the table refuses beyond
// maxForwarded.
func TestForwardTableBounds(t *testing.T) {
	var ft forwardTable
	s := &Session{}
	a1, _, ok1 := ft.add("n1", s, 7)
	a2, _, ok2 := ft.add("n1", s, 8)
	b1, _, ok3 := ft.add("n2", s, 9)
	if !ok1 || !ok2 || !ok3 || a1 == a2 {
		t.Fatalf("add: %d %d %d", a1, a2, b1)
	}
	if fw := ft.take("n2", a1); fw != nil {
		t.Fatal("an id of n1 found under n2")
	}
	if fw := ft.take("n1", a1); fw == nil || fw.ref != 7 {
		t.Fatalf("take n1 %d: %+v", a1, fw)
	}
	if fw := ft.take("n1", a1); fw != nil {
		t.Fatal("taken twice")
	}
	if got := ft.takeNode("n1"); len(got) != 1 || got[0].ref != 8 {
		t.Fatalf("takeNode n1: %+v", got)
	}
	if ft.n != 1 {
		t.Fatalf("%d waiting, want 1", ft.n)
	}
	for ft.n < maxForwarded {
		if _, _, ok := ft.add("n3", s, 1); !ok {
			t.Fatalf("refused at %d", ft.n)
		}
	}
	if _, _, ok := ft.add("n3", s, 1); ok {
		t.Fatalf("accepted beyond %d", maxForwarded)
	}
}

// TestLinkWorkersBounds: forwarded workers get distinct link ids below
// the stand-ins', at most maxLinkWorkers per destination node, and a
// removed one frees its place.
func TestLinkWorkersBounds(t *testing.T) {
	var lw linkWorkers
	seen := map[uint32]bool{}
	var last uint32
	for i := range maxLinkWorkers {
		id, ok := lw.add(&fwdWorker{}, "n1")
		if !ok {
			t.Fatalf("refused at %d", i)
		}
		if id == 0 || id >= linkIDs || seen[id] {
			t.Fatalf("link id %d (0, a stand-in's, or reused)", id)
		}
		seen[id], last = true, id
	}
	if _, ok := lw.add(&fwdWorker{}, "n1"); ok {
		t.Fatalf("accepted beyond %d workers to one node", maxLinkWorkers)
	}
	if _, ok := lw.add(&fwdWorker{}, "n2"); !ok {
		t.Fatal("another node refused")
	}
	if lw.get(last) == nil {
		t.Fatal("get")
	}
	lw.remove(last, "n1")
	if lw.get(last) != nil {
		t.Fatal("removed, still found")
	}
	if _, ok := lw.add(&fwdWorker{}, "n1"); !ok {
		t.Fatal("refused after a removal")
	}
	// Ids wrap below the stand-ins' and skip those in use.
	lw.next = linkIDs - 2
	a, _ := lw.add(&fwdWorker{}, "n3")
	w := &fwdWorker{}
	b, _ := lw.add(w, "n3")
	if a != linkIDs-1 || b == 0 || b >= linkIDs || lw.get(b) != w {
		t.Fatalf("after the wrap: %d, %d", a, b)
	}
	if b == 1 {
		t.Fatal("the wrap reused id 1, in use")
	}
}
