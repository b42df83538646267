package replica

import (
	"context"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/tracker"
)

// Handing leadership over before a graceful stop.
//
// A host that stops while it leads groups leaves them leaderless until
// their followers' election timeouts run out, and a host with thousands
// of groups starts as many elections at once, which split votes on a
// loaded machine (docs/replication.md, "Figures": 5 to 11 s until every
// group of a restarted host had a leader). [Host.HandOver] moves each
// leadership first, to the voter that is most caught up on a live host:
// the transferee campaigns at once, with no timeout and no vote to
// split, and the group stays led while this host is down.

// handOverRetry is how often HandOver looks at the groups it still leads,
// and asks again for the transfers Raft gave up (a transfer aborts after
// an election timeout).
const handOverRetry = 50 * time.Millisecond

// HandOver transfers the leadership of every group this host leads to
// another voter, and waits until each of them knows its new leader, or
// ctx ends. It returns how many groups it led at the start, and how many
// of them still wait for a new leader when ctx ended. A group with no
// other voter on a live host stays led here, and is counted in neither.
// Proposals made meanwhile to a group being handed over fail as for any
// leader change ([NotLeaderError]).
func (h *Host) HandOver(ctx context.Context) (led, left int, err error) {
	var pending map[GroupID]*Group
	if err := h.call(func() { pending = h.leadGroups() }); err != nil {
		return 0, 0, err
	}
	led = len(pending)
	for {
		if err := h.call(func() { h.transfer(pending) }); err != nil {
			return led, len(pending), err
		}
		if len(pending) == 0 {
			return led, 0, nil
		}
		t := time.NewTimer(handOverRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return led, len(pending), ctx.Err()
		case <-t.C:
		}
	}
}

// leadGroups returns the groups this host leads that have a voter to
// hand over to. It runs on the driver.
func (h *Host) leadGroups() map[GroupID]*Group {
	out := map[GroupID]*Group{}
	for id, g := range h.live {
		if g.damaged == "" && g.rn.BasicStatus().RaftState == raft.StateLeader && g.successor(nil) != 0 {
			out[id] = g
		}
	}
	return out
}

// transfer asks each group of pending this host still leads, with no
// transfer under way, to transfer its leadership, spreading them over
// the other hosts, and takes out of pending the groups that know their
// new leader (or have no one left to hand over to). It runs on the
// driver.
func (h *Host) transfer(pending map[GroupID]*Group) {
	given := map[uint64]int{}
	for id, g := range pending {
		if h.live[id] != g {
			delete(pending, id) // closed meanwhile
			continue
		}
		st := g.rn.BasicStatus()
		switch {
		case st.Lead != raft.None && st.Lead != h.cfg.ID:
			delete(pending, id)
		case st.RaftState == raft.StateLeader && st.LeadTransferee == 0:
			to := g.successor(given)
			if to == 0 {
				delete(pending, id)
				continue
			}
			given[to]++
			g.wakeUp()
			g.rn.TransferLeader(to)
		}
	}
}

// successor returns a voter on a live host other than this one whose log
// matches the leader's furthest (of those, the one given the fewest
// leaderships so far), or 0 if there is none. It runs on the driver.
func (g *Group) successor(given map[uint64]int) uint64 {
	var best, match uint64
	voters := g.cs.GetVoters()
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == g.h.cfg.ID || g.h.down[id] || pr.IsLearner || !slices.Contains(voters, id) {
			return
		}
		if best == 0 || pr.Match > match || pr.Match == match && given[id] < given[best] {
			best, match = id, pr.Match
		}
	})
	return best
}
