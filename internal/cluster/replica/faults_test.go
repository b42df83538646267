package replica

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// indexSM records each applied entry with its index.
type indexSM struct {
	mu   sync.Mutex
	log  []Entry
	seen map[string]int
}

func (s *indexSM) Apply(e Entry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[string]int{}
	}
	s.seen[string(e.Data)]++
	s.log = append(s.log, Entry{Index: e.Index, Term: e.Term, Data: slices.Clone(e.Data)})
	return nil
}

func (s *indexSM) Snapshot() ([]byte, error) { return nil, fmt.Errorf("not used") }
func (s *indexSM) Restore([]byte) error      { return fmt.Errorf("not used") }

func (s *indexSM) entries() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// TestRandomFaults runs concurrent proposers while the network drops
// messages and the leader is isolated again and again, then checks the
// log's invariants: every replica applied the same entries in the same
// order, nothing twice, and every acknowledged proposal is in the log at
// the index it was acknowledged with.
func TestRandomFaults(t *testing.T) {
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	groups := map[uint64]*Group{}
	sms := map[uint64]*indexSM{}
	for _, id := range ids {
		cfg := testConfig()
		cfg.ID, cfg.Transport = id, net.Transport(id)
		h, err := NewHost(store.NewMemFS(), "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		sms[id] = &indexSM{}
		if groups[id], err = h.Group(testGroup, ids, sms[id]); err != nil {
			t.Fatal(err)
		}
	}
	net.SetDrop(0.05)

	type ack struct {
		data  string
		index uint64
	}
	var mu sync.Mutex
	var acks []ack
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				data := fmt.Sprintf("w%d-%d", w, i)
				for _, g := range groups {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					idx, err := g.Propose(ctx, []byte(data))
					cancel()
					if err == nil {
						mu.Lock()
						acks = append(acks, ack{data, idx})
						mu.Unlock()
						break
					}
					if !errors.Is(err, ErrNotLeader) {
						break // outcome unknown: never resent, so never applied twice
					}
				}
			}
		})
	}
	for range 4 {
		var lead uint64
		testutil.WaitForf(t, wait, func() bool {
			for id, g := range groups {
				if l, _ := g.Leader(); l == id {
					lead = id
					return true
				}
			}
			return false
		}, "a leader")
		net.Isolate(lead, ids...)
		time.Sleep(time.Duration(300+rand.IntN(300)) * time.Millisecond) // fault schedule, not a wait for correctness
		net.Heal()
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	net.SetDrop(0)

	mu.Lock()
	defer mu.Unlock()
	if len(acks) == 0 {
		t.Fatal("nothing was acknowledged")
	}
	var maxIdx uint64
	for _, a := range acks {
		maxIdx = max(maxIdx, a.index)
	}
	for id, sm := range sms {
		testutil.WaitForf(t, wait, func() bool {
			e := sm.entries()
			return len(e) > 0 && e[len(e)-1].Index >= maxIdx
		}, "replica %d applies up to %d", id, maxIdx)
	}
	// Wait for every replica to have the same number of entries.
	testutil.WaitForf(t, wait, func() bool {
		n := len(sms[1].entries())
		for _, sm := range sms {
			if len(sm.entries()) != n {
				return false
			}
		}
		return true
	}, "replicas agree on the log length")
	ref := sms[1].entries()
	byIndex := map[uint64]string{}
	for _, e := range ref {
		byIndex[e.Index] = string(e.Data)
	}
	for id, sm := range sms {
		got := sm.entries()
		for i := range got {
			if got[i].Index != ref[i].Index || string(got[i].Data) != string(ref[i].Data) {
				t.Fatalf("replica %d differs at %d: %d:%q vs %d:%q", id, i, got[i].Index, got[i].Data, ref[i].Index, ref[i].Data)
			}
		}
		sm.mu.Lock()
		for d, n := range sm.seen {
			if n > 1 {
				t.Fatalf("replica %d applied %q %d times", id, d, n)
			}
		}
		sm.mu.Unlock()
	}
	for _, a := range acks {
		if byIndex[a.index] != a.data {
			t.Fatalf("acknowledged %q at %d, log has %q", a.data, a.index, byIndex[a.index])
		}
	}
	t.Logf("%d acknowledged, %d in the log", len(acks), len(ref))
}

// TestManyGroups runs 30 groups on 3 hosts: each elects, commits and
// applies on its own, all persisted through each host's one log.
func TestManyGroups(t *testing.T) {
	const n = 30
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	groups := map[GroupID]map[uint64]*Group{}
	sms := map[GroupID]map[uint64]*listSM{}
	for _, id := range ids {
		cfg := testConfig()
		cfg.ID, cfg.Transport = id, net.Transport(id)
		h, err := NewHost(store.NewMemFS(), "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = h.Close() })
		for gid := GroupID(1); gid <= n; gid++ {
			if groups[gid] == nil {
				groups[gid], sms[gid] = map[uint64]*Group{}, map[uint64]*listSM{}
			}
			sm := &listSM{}
			g, err := h.Group(gid, ids, sm)
			if err != nil {
				t.Fatal(err)
			}
			groups[gid][id], sms[gid][id] = g, sm
		}
	}
	var wg sync.WaitGroup
	for gid := GroupID(1); gid <= n; gid++ {
		wg.Go(func() {
			for i := range 5 {
				data := fmt.Sprintf("g%d-%d", gid, i)
				ok := testutil.Eventually(wait, func() bool {
					for _, g := range groups[gid] {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						_, err := g.Propose(ctx, []byte(data))
						cancel()
						if err == nil {
							return true
						}
					}
					return false
				})
				if !ok {
					t.Errorf("group %d: %q not committed", gid, data)
					return
				}
			}
		})
	}
	wg.Wait()
	for gid := GroupID(1); gid <= n; gid++ {
		want := make([]string, 5)
		for i := range want {
			want[i] = fmt.Sprintf("g%d-%d", gid, i)
		}
		// A proposal that timed out may have committed and been made
		// again: every replica holds the same list, whose first
		// occurrences are want in order.
		var ref []string
		for id, sm := range sms[gid] {
			ok := testutil.Eventually(wait, func() bool {
				l := sm.list()
				return slices.Equal(firsts(l), want) && (ref == nil || slices.Equal(l, ref))
			})
			if !ok {
				t.Fatalf("group %d on %d: %q, want %q (another replica: %q)", gid, id, sm.list(), want, ref)
			}
			ref = sm.list()
		}
	}
}

// firsts returns the first occurrence of each item of l, in order.
func firsts(l []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range l {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
