package replica

import (
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// Quiescence: an idle group stops ticking.
//
// A leader whose group is idle (everything committed and applied, every
// replica on a live host caught up, no membership change or leadership
// transfer under way, a majority of the voters' hosts live) sends each
// follower a last heartbeat marked quiesceCtx and stops ticking; a
// follower that gets it, from its leader, at its commit index, stops
// ticking too. A quiet group sends nothing and costs nothing per tick.
//
// Liveness moves to the host: every heartbeat interval each host sends
// every peer host one heartbeat (an envelope of group 0), and notes the
// last time it heard anything from each peer. A peer not heard for an
// election timeout is down; then every quiet follower whose leader is on
// that host wakes with its election timer run to the brink (it campaigns
// within one more election timeout, as if it had been ticking all
// along), and every quiet leader with a replica there wakes, so that
// check-quorum runs again. A peer heard again wakes the quiet leaders
// with a replica there, so that it catches up at once. A host heartbeat
// carries the sender's incarnation (random at each start, in the
// message's Commit field): a peer that restarted faster than an
// election timeout is treated as one that went down and came back.
//
// A quiet group wakes on a proposal, a membership change, a leadership
// transfer, and any message but the quiesce heartbeat itself and the
// plain responses to heartbeats. A quiet leader is never ticked, so
// check-quorum cannot make it step down wrongly; a leader cut off from
// its followers learns it from the hosts' heartbeats (they are down),
// wakes, and steps down after an election timeout as usual.

// quiesceCtx marks the heartbeat by which a leader makes a group quiet.
const quiesceCtx = "courier:quiesce"

// hostGroup is the group id of host heartbeats: no group has it.
const hostGroup GroupID = 0

// wakeUp makes a quiet group tick again. It runs on the driver.
func (g *Group) wakeUp() {
	if g.quiet {
		g.quiet = false
		g.h.wakeups++
	}
	g.h.awake[g.id] = g
	g.h.dirty[g.id] = g
}

// touch marks g for the driver's next look at Readies.
func (g *Group) touch() { g.h.dirty[g.id] = g }

// quiesce makes an awake group quiet, if it is idle.
func (g *Group) quiesce() bool {
	if g.damaged != "" || !g.idleLeader() {
		return false
	}
	st := g.rn.BasicStatus()
	var out []Envelope
	for _, id := range g.replicas() {
		if id == g.h.cfg.ID || g.h.down[id] {
			continue
		}
		out = append(out, Envelope{Group: g.id, Msg: &pb.Message{
			Type: pb.MsgHeartbeat.Enum(), To: u64(id), From: u64(g.h.cfg.ID),
			Term: u64(st.GetTerm()), Commit: u64(st.GetCommit()), Context: []byte(quiesceCtx),
		}})
	}
	for _, e := range out {
		g.h.extra[e.Msg.GetTo()] = append(g.h.extra[e.Msg.GetTo()], e)
	}
	g.quiet = true
	delete(g.h.awake, g.id)
	g.h.quiesced++
	return true
}

// idleLeader reports whether this replica leads an idle group: see the
// conditions above.
func (g *Group) idleLeader() bool {
	st := g.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || st.LeadTransferee != 0 || g.confPending || len(g.rejoin) > 0 {
		return false
	}
	last, _ := g.ms.LastIndex()
	if st.GetCommit() != last || st.Applied != last {
		return false
	}
	ok, live := true, 0
	g.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == g.h.cfg.ID || g.h.down[id] {
			return
		}
		if pr.Match != last || pr.State != tracker.StateReplicate {
			ok = false
		}
	})
	voters := g.cs.GetVoters()
	for _, id := range voters {
		if id == g.h.cfg.ID || !g.h.down[id] {
			live++
		}
	}
	return ok && live > len(voters)/2
}

// replicas returns every replica of the group: voters and learners.
func (g *Group) replicas() []uint64 {
	return append(append([]uint64(nil), g.cs.GetVoters()...), g.cs.GetLearners()...)
}

// stepQuiet runs on the driver after a message from a peer was stepped:
// it makes a follower quiet on its leader's quiesce heartbeat, and wakes
// a quiet group on anything else that needs it.
// commit is the commit index the message carried (step may clamp it).
func (g *Group) stepQuiet(m *pb.Message, quiesce bool, commit uint64) {
	switch {
	case quiesce:
		st := g.rn.BasicStatus()
		if st.RaftState == raft.StateFollower && st.Lead == m.GetFrom() && st.GetTerm() == m.GetTerm() && st.GetCommit() == commit {
			if !g.quiet {
				g.quiet = true
				delete(g.h.awake, g.id)
				g.h.quiesced++
			}
			return
		}
		g.wakeUp()
	case g.quiet && m.GetType() == pb.MsgHeartbeatResp && len(m.GetContext()) == 0:
		// A follower answering the quiesce heartbeat: nothing to do. One
		// that is behind gets appends from Raft without a tick.
	case g.quiet && m.GetType() == pb.MsgHeartbeat && g.rn.BasicStatus().Lead == m.GetFrom():
		// The leader's heartbeat while quiet: the leader is awake, so
		// this replica wakes too.
		g.wakeUp()
	default:
		if g.quiet {
			g.wakeUp()
		}
	}
}

// Host liveness.

// hearFrom notes that peer host id spoke. It runs on the driver.
func (h *Host) hearFrom(id uint64, now time.Time) {
	if id == h.cfg.ID || id == 0 {
		return
	}
	h.heard[id] = now
	if h.down[id] {
		delete(h.down, id)
		h.peerUp(id)
	}
}

// hearHost notes a host heartbeat from peer id, of incarnation inc.
func (h *Host) hearHost(id, inc uint64) {
	old, known := h.incarn[id]
	h.incarn[id] = inc
	if known && old != inc {
		h.restarts++
		h.cfg.Logger.Info("replica: peer host restarted", "peer", id)
		h.peerDown(id) // its groups lost their state: wake as for a death...
		h.peerUp(id)   // ...and a return
	}
}

// electionTimeout is how long a host goes unheard before it is down.
func (h *Host) electionTimeout() time.Duration {
	return time.Duration(h.cfg.ElectionTicks) * h.cfg.TickInterval
}

// peers returns the hosts of every replica of every group, but this one.
func (h *Host) peers() map[uint64]bool {
	if h.peerSet != nil && !h.peersStale {
		return h.peerSet
	}
	set := map[uint64]bool{}
	for _, g := range h.live {
		for _, id := range g.replicas() {
			if id != h.cfg.ID {
				set[id] = true
			}
		}
	}
	now := time.Now()
	for id := range set {
		if _, ok := h.heard[id]; !ok {
			h.heard[id] = now // a grace period for a host never heard
		}
	}
	h.peerSet, h.peersStale = set, false
	return set
}

// tickHosts runs on the driver at every tick: it sends the host
// heartbeats when due and finds the peers that went down.
func (h *Host) tickHosts(now time.Time) {
	peers := h.peers()
	h.hbTicks++
	if h.hbTicks >= h.cfg.HeartbeatTicks {
		h.hbTicks = 0
		for id := range peers {
			h.extra[id] = append(h.extra[id], Envelope{Group: hostGroup, Msg: &pb.Message{
				Type: pb.MsgHeartbeat.Enum(), To: u64(id), From: u64(h.cfg.ID), Commit: u64(h.incarnation),
			}})
		}
	}
	timeout := h.electionTimeout()
	for id := range peers {
		if !h.down[id] && now.Sub(h.heard[id]) > timeout {
			h.down[id] = true
			h.cfg.Logger.Info("replica: peer host down", "peer", id)
			h.peerDown(id)
		}
	}
}

// peerDown wakes the quiet groups that host id's failure concerns: a
// follower of a leader there campaigns within an election timeout; a
// leader with a replica there runs check-quorum again.
func (h *Host) peerDown(id uint64) {
	for _, g := range h.live {
		if !g.quiet {
			continue
		}
		st := g.rn.BasicStatus()
		switch {
		case st.RaftState == raft.StateLeader && containsID(g.replicas(), id):
			g.wakeUp()
		case st.RaftState != raft.StateLeader && st.Lead == id:
			g.wakeUp()
			// Nothing was heard from the leader for an election timeout:
			// run the election timer to just short of its minimum, as if
			// the group had been ticking all along. It campaigns within
			// one more election timeout (randomized), and grants votes
			// (its leader lease is over) from the next tick.
			for range h.cfg.ElectionTicks - 1 {
				g.rn.Tick()
			}
		}
	}
}

// peerUp wakes the quiet leaders with a replica on host id, so that it
// hears from them and catches up without waiting for an election.
func (h *Host) peerUp(id uint64) {
	for _, g := range h.live {
		if g.quiet && g.rn.BasicStatus().RaftState == raft.StateLeader && containsID(g.replicas(), id) {
			g.wakeUp()
		}
	}
}

func containsID(ids []uint64, id uint64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// QuietStats are a host's quiescence counters.
type QuietStats struct {
	Groups  int    // groups open on the host
	Awake   int    // of which ticking
	Quiesce uint64 // times a group fell quiet
	Wakeups uint64 // times a quiet group woke
	Down    int    // peer hosts not heard for an election timeout
	// Restarts counts the restarts of peer hosts seen in their
	// heartbeats.
	Restarts uint64
}

// QuietStats returns the host's quiescence counters.
func (h *Host) QuietStats() QuietStats {
	var s QuietStats
	_ = h.call(func() {
		s = QuietStats{Groups: len(h.live), Awake: len(h.awake), Quiesce: h.quiesced, Wakeups: h.wakeups, Down: len(h.down), Restarts: h.restarts}
	})
	return s
}
