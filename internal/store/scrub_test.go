package store

import (
	"errors"
	"testing"
	"time"
)

// TestScrubFindsDamage: after a clean close (a checkpoint at the end, so
// Open verifies nothing), the background check finds a record whose
// payload changed (stepped over: one record) and a record whose header
// changed (the rest of its segment, counted best effort), counts them in
// Stats, and leaves every other record readable.
func TestScrubFindsDamage(t *testing.T) {
	fs := NewMemFS()
	opts := Options{SegmentSize: MinSegmentSize, ScrubRate: 1 << 30}
	l, _, err := Open(fs, "log", opts)
	if err != nil {
		t.Fatal(err)
	}
	var refs []Ref
	for i := range 60 {
		ref, err := l.AppendSync(1, 1, make([]byte, 200+i))
		if err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	must(t, l.Close())
	if refs[len(refs)-1].Seg < 3 {
		t.Fatalf("the records span %d segments; want 3 or more", refs[len(refs)-1].Seg)
	}
	// A payload byte of the 4th record of segment 1; a reserved header byte of the
	// 3rd record of segment 2.
	var seg1, seg2 []Ref
	for _, r := range refs {
		switch r.Seg {
		case 1:
			seg1 = append(seg1, r)
		case 2:
			seg2 = append(seg2, r)
		}
	}
	corrupt := func(ref Ref, at int) {
		name := join("log", segName(ref.Seg))
		b, err := fs.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		b[int(ref.Off)+at] ^= 0xff
		fs.WriteFile(name, b)
	}
	corrupt(seg1[3], recHeaderSize+50)
	corrupt(seg2[2], 13) // a reserved byte: the header is not sound

	l, rec, err := Open(fs, "log", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !rec.Clean() || rec.ReplayRecords != 0 {
		t.Fatalf("Open verified something: %+v", rec)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().Scrub != ScrubDone {
		if time.Now().After(deadline) {
			t.Fatalf("the check is not done: %+v", l.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	st := l.Stats()
	wantRecords := int64(1 + len(seg2) - 2) // the payload; the bad header and the rest of its segment
	wantBytes := seg1[3].Size() + int64(seg2[len(seg2)-1].end().Off-seg2[2].Off)
	if st.DamagedRecords != wantRecords || st.DamagedBytes != wantBytes || int64(st.ScrubBytes) != st.ScrubTotal {
		t.Errorf("damaged %d records, %d bytes; checked %d of %d; want %d records, %d bytes",
			st.DamagedRecords, st.DamagedBytes, st.ScrubBytes, st.ScrubTotal, wantRecords, wantBytes)
	}
	for _, r := range refs {
		_, err := l.Read(r, nil)
		bad := r == seg1[3] || r == seg2[2]
		if bad != errors.Is(err, ErrCorrupt) {
			t.Errorf("read %v: %v", r, err)
		}
	}
}

// TestScrubOff: without a rate there is no check, and Stats says so.
func TestScrubOff(t *testing.T) {
	l, _, err := Open(NewMemFS(), "log", Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if s := l.Stats().Scrub; s != ScrubOff {
		t.Fatalf("scrub %q without a rate", s)
	}
}
