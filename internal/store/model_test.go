package store

import (
	"bytes"
	"encoding/binary"
	"maps"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

// queueModel is what the queue layer will do with the log: an index of
// live records, updated under a lock held across each Append or Release,
// serialized by checkpoints and rebuilt by Replay.
type queueModel struct {
	mu    sync.Mutex
	index map[Ref]uint32 // live record -> id
}

func (m *queueModel) encode() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := make([]byte, 0, len(m.index)*16)
	for ref, id := range m.index {
		b = binary.LittleEndian.AppendUint32(b, ref.Seg)
		b = binary.LittleEndian.AppendUint32(b, ref.Off)
		b = binary.LittleEndian.AppendUint32(b, ref.Len)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return b
}

func decodeModel(b []byte) map[Ref]uint32 {
	out := map[Ref]uint32{}
	for ; len(b) >= 16; b = b[16:] {
		ref := Ref{Pos: Pos{Seg: binary.LittleEndian.Uint32(b), Off: binary.LittleEndian.Uint32(b[4:])}, Len: binary.LittleEndian.Uint32(b[8:])}
		out[ref] = binary.LittleEndian.Uint32(b[12:])
	}
	return out
}

// TestQueueModelCrash runs appenders, releasers and a checkpointer the way
// the queue layer will, crashes the disk at a random moment, rebuilds the
// index from the checkpoint and Replay, and goes on from there, three
// generations in a row. After each crash:
//   - every confirmed record never released is in the index and reads back;
//   - no record whose release was confirmed is in the index;
//   - every record in the index reads back: no segment it needs was deleted;
//   - the store's live count equals the index size.
func TestQueueModelCrash(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	opts := smallOptions()
	opts.MaxPending = 16 << 10
	var nextID atomic.Uint32
	for round := range 20 {
		fs := NewMemFS()
		var (
			omu        sync.Mutex         // guards the outcome maps
			confirmed  = map[Ref]uint32{} // appends confirmed
			releaseReq = map[Ref]bool{}   // releases asked
			releaseOK  = map[Ref]bool{}   // releases confirmed
		)
		for gen := range 3 {
			l, rec := mustOpen(t, fs, testDir, opts)
			m := &queueModel{index: rebuildIndex(t, l, rec)}
			if gen > 0 {
				checkModel(t, l, rec, m.index, confirmed, releaseReq, releaseOK)
			}
			var (
				stop atomic.Bool
				wg   sync.WaitGroup
			)
			for a := range 3 {
				wg.Go(func() {
					for !stop.Load() {
						id := nextID.Add(1)
						ready := make(chan struct{})
						var ref Ref
						m.mu.Lock()
						r, err := l.Append(uint32(a), 1, payloadFor(int(id)), func(err error) {
							<-ready
							if err == nil {
								omu.Lock()
								confirmed[ref] = id
								omu.Unlock()
							}
						})
						if err == nil {
							m.index[r] = id
						}
						m.mu.Unlock()
						ref = r
						close(ready)
						if err != nil {
							return
						}
					}
				})
			}
			wg.Go(func() { // releaser: acks random live records
				prng := rand.New(rand.NewPCG(uint64(round), uint64(gen)))
				for !stop.Load() {
					m.mu.Lock()
					var victims []Ref
					for ref := range m.index {
						if prng.IntN(3) == 0 {
							victims = append(victims, ref)
						}
						if len(victims) == 8 {
							break
						}
					}
					if len(victims) == 0 {
						m.mu.Unlock()
						continue
					}
					for _, v := range victims {
						delete(m.index, v)
					}
					omu.Lock()
					for _, v := range victims {
						releaseReq[v] = true
					}
					omu.Unlock()
					err := l.Release(0, victims, func(err error) {
						if err == nil {
							omu.Lock()
							for _, v := range victims {
								releaseOK[v] = true
							}
							omu.Unlock()
						}
					})
					m.mu.Unlock()
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() { // checkpointer
				for !stop.Load() {
					if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return m.encode(), nil }); err != nil {
						return
					}
				}
			})
			// Crash after a random amount of confirmed work.
			omu.Lock()
			target := len(confirmed) + 200 + rng.IntN(1500)
			omu.Unlock()
			for {
				omu.Lock()
				n := len(confirmed)
				omu.Unlock()
				if n >= target {
					break
				}
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			omu.Lock()
			crashed := fs.Crash(func(_ string, n int) int { return rng.IntN(n + 1) })
			wantConfirmed := maps.Clone(confirmed)
			wantAsked := maps.Clone(releaseReq)
			wantReleased := maps.Clone(releaseOK)
			omu.Unlock()
			stop.Store(true)
			wg.Wait()
			l.Close()
			// What happened after the crash image was taken did not happen.
			confirmed, releaseReq, releaseOK = wantConfirmed, wantAsked, wantReleased
			fs = crashed
		}
		l, rec := mustOpen(t, fs, testDir, opts)
		checkModel(t, l, rec, rebuildIndex(t, l, rec), confirmed, releaseReq, releaseOK)
		l.Close()
	}
}

// rebuildIndex is the queue layer's restart: the checkpoint's index, then
// Replay applied idempotently.
func rebuildIndex(t *testing.T, l *Log, rec *Recovery) map[Ref]uint32 {
	t.Helper()
	// Torn tails (Truncated) are expected; the crash model keeps a prefix
	// of unsynced writes, so nothing synced is ever damaged.
	if len(rec.Corrupt) != 0 || len(rec.Missing) != 0 || rec.CheckpointErr != nil {
		t.Fatalf("recovery: corrupt %v missing %v checkpoint %v", rec.Corrupt, rec.Missing, rec.CheckpointErr)
	}
	index := decodeModel(rec.State)
	var rels []Ref
	if err := l.Replay(func(r Record) error {
		if r.Kind == KindRelease {
			rels, _ = r.Released(rels[:0])
			for _, ref := range rels {
				delete(index, ref)
			}
			return nil
		}
		index[r.Ref] = 0 // the id is checked by payload below
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return index
}

func checkModel(t *testing.T, l *Log, rec *Recovery, index, confirmed map[Ref]uint32, asked, released map[Ref]bool) {
	t.Helper()
	for ref, id := range confirmed {
		if asked[ref] {
			continue
		}
		if _, ok := index[ref]; !ok {
			t.Fatalf("confirmed record %d at %v missing from the rebuilt index (recovery %+v)", id, ref, rec)
		}
	}
	for ref := range released {
		if _, ok := index[ref]; ok {
			t.Fatalf("record at %v released durably is back", ref)
		}
	}
	var buf []byte
	for ref := range index {
		r, err := l.Read(ref, buf)
		if err != nil {
			t.Fatalf("indexed record at %v unreadable: %v (recovery %+v)", ref, err, rec)
		}
		if id, ok := confirmed[ref]; ok && !bytes.Equal(r.Payload, payloadFor(int(id))) {
			t.Fatalf("record %d at %v has the wrong payload", id, ref)
		}
	}
	if s := l.Stats(); s.LiveRecords != int64(len(index)) {
		t.Fatalf("store counts %d live records, the index holds %d", s.LiveRecords, len(index))
	}
}
