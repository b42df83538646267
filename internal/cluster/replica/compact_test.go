package replica

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// compactConfig makes compaction frequent: 64 KiB segments, a snapshot
// every 64 entries, a checkpoint every 32 KiB. Elections are slow (2 s)
// so that a loaded machine does not change the leader mid-test.
func compactConfig() Config {
	cfg := testConfig()
	cfg.ElectionTicks = 100
	cfg.SnapshotEntries = 64
	cfg.CheckpointBytes = 32 << 10
	cfg.CheckpointInterval = 100 * time.Millisecond
	cfg.Store = store.Options{SegmentSize: 64 << 10, MinFreeDisk: -1}
	return cfg
}

// storeBytes is the size of host h's segments.
func storeBytes(h *Host) int64 {
	var n int64
	for _, s := range h.log.Segments() {
		n += s.Size
	}
	return n
}

// countingState is a JournalState that counts its restores.
type countingState struct {
	*JournalState
	restores atomic.Int32
}

func (s *countingState) Restore(b []byte) error {
	s.restores.Add(1)
	return s.JournalState.Restore(b)
}

// journalTask is the payload of task i.
func journalTask(i int) []byte {
	b := bytes.Repeat([]byte{byte(i)}, 1024)
	copy(b, fmt.Sprintf("task-%d", i))
	return b
}

// TestCompactionBoundsStore runs 3,000 submit/ack pairs of 1 KiB tasks
// through a queue journal on 3 hosts, one follower cut off: the two
// others' stores stay bounded (snapshots, releases, checkpoints and
// deleted segments) although each writes over 3 MiB; the cut-off
// follower catches up by snapshot once healed, and its store is bounded
// too; after a power cut of all three, every host restarts from its
// compacted log with the live tasks, nothing lost.
func TestCompactionBoundsStore(t *testing.T) {
	c := newJournalClusterConfig(t, compactConfig())
	lag := uint64(3)
	for id := range c.hosts {
		_ = c.hosts[id].Close()
	}
	// Restart with counting state machines, host 3 cut off from the start.
	states := map[uint64]*countingState{}
	for _, id := range []uint64{1, 2, 3} {
		c.net.Remove(id)
		c.fss[id] = store.NewMemFS()
	}
	c.net.Isolate(lag, 1, 2, 3)
	open := func(id uint64, peers []uint64) {
		cfg := c.cfg
		cfg.ID, cfg.Transport = id, c.net.Transport(id)
		h, err := NewHost(c.fss[id], "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		states[id] = &countingState{JournalState: NewJournalState()}
		g, err := h.Group(testGroup, peers, states[id])
		if err != nil {
			t.Fatal(err)
		}
		c.hosts[id], c.groups[id] = h, g
	}
	for _, id := range []uint64{1, 2, 3} {
		open(id, []uint64{1, 2, 3})
	}
	lead := waitLeaderReady(t, c.groups, 1, 2)
	j := NewJournal(c.groups[lead], states[lead].JournalState)

	const tasks, batch, keep = 3000, 25, 50
	var maxSize int64
	for i := 0; i < tasks; i += batch {
		refs := make([]queue.Ref, 0, batch)
		errc := make(chan error, batch)
		for k := i; k < i+batch; k++ {
			ref, err := j.Append(1, journalTask(k), func(err error) { errc <- err })
			if err != nil {
				t.Fatal(err)
			}
			refs = append(refs, ref)
		}
		for range batch {
			if err := <-errc; err != nil {
				t.Fatalf("append: %v", err)
			}
		}
		if i+batch > tasks-keep {
			continue // the last tasks stay live
		}
		if err := j.Release(refs, func(err error) { errc <- err }); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("release: %v", err)
		}
		if i >= tasks/3 {
			for _, id := range []uint64{1, 2} {
				maxSize = max(maxSize, storeBytes(c.hosts[id]))
			}
		}
	}
	// Each host wrote over 3 MiB; what it keeps is a few segments of the
	// tail since the last snapshot and checkpoint.
	const bound = 512 << 10
	t.Logf("largest store of hosts 1, 2 over the last 2/3 of the run: %d bytes; released %d, %d records; checkpoints %d, %d",
		maxSize, c.hosts[1].released.Load(), c.hosts[2].released.Load(), c.hosts[1].checkpoints.Load(), c.hosts[2].checkpoints.Load())
	if maxSize > bound {
		t.Fatalf("a store grew to %d bytes, want at most %d", maxSize, bound)
	}
	wantLive := func(st *JournalState) bool {
		if st.Live() != keep {
			return false
		}
		i := tasks - keep
		ok := true
		_ = st.Replay(func(e queue.Entry) error {
			ok = ok && bytes.Equal(e.Payload, journalTask(i))
			i++
			return nil
		})
		return ok
	}

	// The cut-off follower catches up by snapshot: the others no longer
	// hold the early entries, neither in memory nor on disk.
	if first := c.hosts[lead].log.Segments()[0].Num; first < 10 {
		t.Fatalf("the leader's oldest segment is %d: segments were not deleted", first)
	}
	c.net.Heal()
	if !testutil.Eventually(wait, func() bool { return wantLive(states[lag].JournalState) }) {
		for id, g := range c.groups {
			st, err := g.Status()
			t.Logf("replica %d: %+v %v restores %d live %d", id, st, err, states[id].restores.Load(), states[id].Live())
		}
	}
	testutil.WaitForf(t, time.Millisecond, func() bool { return wantLive(states[lag].JournalState) },
		"the lagging replica catches up (live %d)", states[lag].Live())
	if states[lag].restores.Load() == 0 {
		t.Fatal("the lagging replica caught up without a snapshot")
	}
	testutil.WaitForf(t, wait, func() bool { return c.hosts[lag].released.Load() > 0 },
		"the lagging replica releases the records its snapshot replaced")

	// A power cut of all three: each restarts from snapshot and tail.
	for id, h := range c.hosts {
		c.net.Remove(id)
		disk := c.fss[id].Crash(nil)
		_ = h.Close()
		c.fss[id] = disk
	}
	for _, id := range []uint64{1, 2, 3} {
		open(id, nil)
	}
	for _, id := range []uint64{1, 2, 3} {
		testutil.WaitForf(t, wait, func() bool { return wantLive(states[id].JournalState) },
			"host %d restarts with the %d live tasks (has %d)", id, keep, states[id].Live())
	}
	if !testutil.Eventually(wait, func() bool {
		for _, g := range c.groups {
			if l, _ := g.Leader(); l == 0 {
				return false
			}
		}
		return true
	}) {
		for id, g := range c.groups {
			st, err := g.Status()
			t.Logf("replica %d: %+v %v %+v", id, st, err, c.hosts[id].QuietStats())
		}
	}
	lead = waitLeaderReady(t, c.groups, 1, 2, 3)
	j = NewJournal(c.groups[lead], states[lead].JournalState)
	errc := make(chan error, 1)
	if _, err := j.Append(1, journalTask(tasks), func(err error) { errc <- err }); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("append after restart: %v", err)
	}
}

// waitLeaderReady waits until one of the groups ids leads, ready to serve.
func waitLeaderReady(t *testing.T, groups map[uint64]*Group, ids ...uint64) uint64 {
	t.Helper()
	var lead uint64
	testutil.WaitForf(t, wait, func() bool {
		for _, id := range ids {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			err := groups[id].WaitLeaderReady(ctx)
			cancel()
			if err == nil {
				lead = id
				return true
			}
		}
		return false
	}, "a leader among %v", ids)
	if !slices.Contains(ids, lead) {
		t.Fatalf("leader %d", lead)
	}
	return lead
}

// blobSM is a state machine whose state is a 200 KiB blob: an entry
// (off u32 | data) writes data at off. Its snapshots do not fit a record
// of a 64 KiB segment.
type blobSM struct {
	mu       sync.Mutex
	blob     []byte
	restores int
}

const blobSize = 200 << 10

func newBlobSM() *blobSM { return &blobSM{blob: make([]byte, blobSize)} }

func (s *blobSM) Apply(e Entry) error {
	if len(e.Data) < 4 {
		return nil
	}
	off := int(binary.LittleEndian.Uint32(e.Data))
	s.mu.Lock()
	copy(s.blob[off%blobSize:], e.Data[4:])
	s.mu.Unlock()
	return nil
}

func (s *blobSM) Snapshot() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.blob), nil
}

func (s *blobSM) Restore(b []byte) error {
	if len(b) != blobSize {
		return fmt.Errorf("blob snapshot of %d bytes", len(b))
	}
	s.mu.Lock()
	s.blob = slices.Clone(b)
	s.restores++
	s.mu.Unlock()
	return nil
}

func (s *blobSM) get() ([]byte, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.blob), s.restores
}

// TestLargeSnapshots: a state machine whose snapshots (200 KiB) are
// larger than a store record (64 KiB segments) is still compacted: its
// snapshots are stored in pieces, the store stays bounded while 2 MiB of
// entries and a dozen snapshots are written, a cut-off follower catches
// up by snapshot, and after a power cut every replica restores its
// state from its pieces.
func TestLargeSnapshots(t *testing.T) {
	cfg := compactConfig()
	cfg.SnapshotEntries = 100
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	fss := map[uint64]*store.MemFS{}
	hosts := map[uint64]*Host{}
	groups := map[uint64]*Group{}
	sms := map[uint64]*blobSM{}
	open := func(id uint64, peers []uint64) {
		c := cfg
		c.ID, c.Transport = id, net.Transport(id)
		h, err := NewHost(fss[id], "/data", c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		sms[id] = newBlobSM()
		g, err := h.Group(testGroup, peers, sms[id])
		if err != nil {
			t.Fatal(err)
		}
		hosts[id], groups[id] = h, g
	}
	for _, id := range ids {
		fss[id] = store.NewMemFS()
	}
	net.Isolate(3, ids...)
	for _, id := range ids {
		open(id, ids)
	}
	lead := waitLeaderReady(t, groups, 1, 2)
	const n, workers = 2000, 8
	var maxSize int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				data := binary.LittleEndian.AppendUint32(nil, uint32(i%200*1024))
				data = append(data, bytes.Repeat([]byte{byte(i)}, 1020)...)
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				_, err := groups[lead].Propose(ctx, data)
				cancel()
				if err != nil {
					t.Errorf("propose %d: %v", i, err)
					return
				}
				if i > n/3 {
					mu.Lock()
					maxSize = max(maxSize, storeBytes(hosts[1]), storeBytes(hosts[2]))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	const bound = 1536 << 10
	t.Logf("largest store of hosts 1, 2 over the last 2/3: %d bytes", maxSize)
	if maxSize > bound {
		t.Fatalf("a store grew to %d bytes, want at most %d", maxSize, bound)
	}
	want, _ := sms[lead].get()
	same := func(id uint64) bool {
		b, _ := sms[id].get()
		return bytes.Equal(b, want)
	}
	net.Heal()
	testutil.WaitForf(t, wait, func() bool { return same(3) }, "the cut-off follower catches up")
	if _, r := sms[3].get(); r == 0 {
		t.Fatal("the cut-off follower caught up without a snapshot")
	}
	for id, h := range hosts {
		net.Remove(id)
		disk := fss[id].Crash(nil)
		_ = h.Close()
		fss[id] = disk
	}
	for _, id := range ids {
		open(id, nil)
	}
	for _, id := range ids {
		testutil.WaitForf(t, wait, func() bool { return same(id) }, "host %d restores its state", id)
		if _, r := sms[id].get(); r == 0 {
			t.Errorf("host %d restarted without its snapshot", id)
		}
	}
}
