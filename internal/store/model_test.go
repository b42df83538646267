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
// the queue layer will, crashes the disk at a random moment, and rebuilds
// the index from the checkpoint and Replay. Then:
//   - every confirmed record never released is in the index and reads back;
//   - no record whose release was confirmed is in the index;
//   - every record in the index reads back: no segment it needs was deleted;
//   - the store's live count equals the index size.
func TestQueueModelCrash(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	opts := smallOptions()
	opts.MaxPending = 16 << 10
	for round := range 30 {
		fs := NewMemFS()
		l, _ := mustOpen(t, fs, testDir, opts)
		m := &queueModel{index: map[Ref]uint32{}}
		var (
			omu        sync.Mutex // guards the outcome maps
			confirmed  = map[Ref]uint32{}
			releaseReq = map[Ref]bool{} // release asked
			releaseOK  = map[Ref]bool{} // release confirmed durable
			stop       atomic.Bool
			wg         sync.WaitGroup
			nextID     atomic.Uint32
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
			prng := rand.New(rand.NewPCG(uint64(round), 9))
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
		target := 200 + rng.IntN(1500)
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
		wantLive := maps.Clone(confirmed)
		asked := maps.Clone(releaseReq)
		released := maps.Clone(releaseOK)
		crashed := fs.Crash(func(_ string, n int) int { return rng.IntN(n + 1) })
		omu.Unlock()
		stop.Store(true)
		wg.Wait()
		l.Close()

		l2, rec := mustOpen(t, crashed, testDir, opts)
		// Torn tails (Truncated) are expected; the crash model keeps a prefix
		// of unsynced writes, so nothing synced is ever damaged.
		if len(rec.Corrupt) != 0 || len(rec.Missing) != 0 || rec.CheckpointErr != nil {
			t.Fatalf("round %d: recovery corrupt %v missing %v checkpoint %v", round, rec.Corrupt, rec.Missing, rec.CheckpointErr)
		}
		index := decodeModel(rec.State)
		var rels []Ref
		if err := l2.Replay(func(r Record) error {
			if r.Kind == KindRelease {
				rels, _ = r.Released(rels[:0])
				for _, ref := range rels {
					delete(index, ref)
				}
				return nil
			}
			index[r.Ref] = r.Queue // idempotent; the id is checked below by payload
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for ref, id := range wantLive {
			if asked[ref] {
				continue
			}
			if _, ok := index[ref]; !ok {
				t.Fatalf("round %d: confirmed record %d at %v missing from the rebuilt index", round, id, ref)
			}
		}
		for ref := range released {
			if _, ok := index[ref]; ok {
				t.Fatalf("round %d: record at %v released durably is back", round, ref)
			}
		}
		var buf []byte
		for ref := range index {
			r, err := l2.Read(ref, buf)
			if err != nil {
				t.Fatalf("round %d: indexed record at %v unreadable: %v (recovery %+v)", round, ref, err, rec)
			}
			if id, ok := wantLive[ref]; ok && !bytes.Equal(r.Payload, payloadFor(int(id))) {
				t.Fatalf("round %d: record %d at %v has the wrong payload", round, id, ref)
			}
		}
		if s := l2.Stats(); s.LiveRecords != int64(len(index)) {
			t.Fatalf("round %d: store counts %d live records, the index holds %d", round, s.LiveRecords, len(index))
		}
		l2.Close()
	}
}
