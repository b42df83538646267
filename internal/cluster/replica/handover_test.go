package replica

import (
	"context"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestHandOver: a host that leads groups hands every leadership over to
// the other hosts' replicas, which lead at once (no election timeout
// passes with the groups leaderless); after the host closed, every group
// still has a leader and takes proposals. The leaderships are spread
// over the other hosts.
func TestHandOver(t *testing.T) {
	const n = 24
	net := NewMemNetwork()
	ids := []uint64{1, 2, 3}
	hosts := map[uint64]*Host{}
	groups := map[GroupID]map[uint64]*Group{}
	for _, id := range ids {
		cfg := testConfig()
		cfg.ID, cfg.Transport = id, net.Transport(id)
		h, err := NewHost(store.NewMemFS(), "/data", cfg)
		if err != nil {
			t.Fatal(err)
		}
		hosts[id] = h
		t.Cleanup(func() { _ = h.Close() })
		for gid := GroupID(1); gid <= n; gid++ {
			if groups[gid] == nil {
				groups[gid] = map[uint64]*Group{}
			}
			g, err := h.Group(gid, ids, &listSM{})
			if err != nil {
				t.Fatal(err)
			}
			groups[gid][id] = g
		}
	}
	leaderOf := func(gid GroupID) uint64 {
		for id, g := range groups[gid] {
			if st, err := g.Status(); err == nil && st.Role == "leader" {
				return id
			}
		}
		return 0
	}
	testutil.WaitForf(t, wait, func() bool {
		for gid := GroupID(1); gid <= n; gid++ {
			if leaderOf(gid) == 0 {
				return false
			}
		}
		return true
	}, "every group led")
	// Make host 1 lead every group, by handing the others over to it.
	for gid := GroupID(1); gid <= n; gid++ {
		if l := leaderOf(gid); l != 1 {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			err := groups[gid][l].TransferLeadership(ctx, 1)
			cancel()
			if err != nil {
				t.Fatalf("group %d: transfer to 1: %v", gid, err)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	led, left, err := hosts[1].HandOver(ctx)
	if err != nil || led != n || left != 0 {
		t.Fatalf("HandOver: led %d, left %d, %v; want %d, 0, nil", led, left, err, n)
	}
	t.Logf("%d leaderships handed over in %v", led, time.Since(start))
	per := map[uint64]int{}
	for gid := GroupID(1); gid <= n; gid++ {
		// At once: HandOver returned once host 1 heard from the new
		// leader, not an election timeout later.
		l := leaderOf(gid)
		if l == 1 || l == 0 {
			t.Fatalf("group %d: led by %d right after the hand-over, want host 2 or 3", gid, l)
		}
		per[l]++
	}
	// Spread over the other two (both caught up, as the groups are idle).
	if per[2] < n/4 || per[3] < n/4 {
		t.Errorf("leaderships handed to host 2: %d, host 3: %d; want them spread", per[2], per[3])
	}
	net.Remove(1)
	if err := hosts[1].Close(); err != nil {
		t.Fatal(err)
	}
	for gid := GroupID(1); gid <= n; gid++ {
		ok := testutil.Eventually(wait, func() bool {
			for id, g := range groups[gid] {
				if id == 1 {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := g.Propose(ctx, []byte("after"))
				cancel()
				if err == nil {
					return true
				}
			}
			return false
		})
		if !ok {
			t.Fatalf("group %d takes no proposal after host 1 left", gid)
		}
	}
}
