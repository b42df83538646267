package cluster

import (
	"slices"
	"strings"
	"time"
)

// Member is a node of the cluster as this node sees it.
type Member struct {
	Name        string
	Self        bool   // this node
	ClusterAddr string // its cluster address
	ClientURL   string
	HTTPURL     string
	Version     string
	// State is alive, suspect, dead or left: see [Fabric.Members].
	State string
	// Since is when State began, as this node saw it.
	Since time.Time
	// Started is when the node started, as it gossips.
	Started time.Time
	// Hosts is what the node hosts, as it gossiped last (every few
	// seconds when it changes).
	Hosts Hosts
	// Link is this node's link with it (zero for Self).
	Link LinkStats
}

// LinkStats describe this node's links with a peer. The counters run
// over every session since this node first met the peer; PINGs and
// PONGs count as frames.
type LinkStats struct {
	// Up is whether both links are up; Since when they came up or went
	// down last.
	Up    bool
	Since time.Time
	// Control and Data count each link's traffic.
	Control, Data LinkCounters
	// RTT is the round trip of the last link heartbeat (0: none yet).
	RTT time.Duration
	// Cuts count the sessions with the peer that ended, by cause.
	Cuts LinkCuts
	// Dropped counts the frames Send refused because the link's outbox
	// was past its offer limit (ErrLinkFull); publications and requests
	// wait for room instead, and are never counted here.
	Dropped uint64
}

// LinkCuts count the ends of a peer's sessions by cause, since this node
// first met it.
type LinkCuts struct {
	// Silent: a link heard nothing, heartbeats included, for three link
	// heartbeats.
	Silent uint64
	// Stalled: the peer took nothing written to a link for the
	// slow-consumer timeout.
	Stalled uint64
	// Broken: a link's connection failed (reset, closed, a bad frame).
	Broken uint64
	// Declared: memberlist declared the node dead or gone.
	Declared uint64
	// Other: the peer dialled again (it found the session dead first),
	// the broker cut it, or this node closed.
	Other uint64
}

// LinkCounters count a link's frames and bytes each way. Bytes are those
// of the frames, TLS excluded.
type LinkCounters struct {
	FramesOut, FramesIn, BytesOut, BytesIn uint64
}

// suspectAfter is how long a node memberlist has alive may have no
// links with this one before it shows as suspect.
const suspectAfter = time.Second

// Members returns every node this one knows, itself included, sorted
// by name. A node's State is memberlist's view, made sharper by the
// links: "dead" as soon as a link broke and a dial found nothing
// listening at its cluster address (a killed process), "suspect" while
// memberlist has it alive but this node has had no links with it for a
// second (it does not answer, or the network between them is cut),
// "left" after it closed gracefully.
func (f *Fabric) Members() []Member {
	now := time.Now()
	out := []Member{{
		Name: f.name, Self: true, ClusterAddr: f.advertise, ClientURL: f.cfg.ClientURL, HTTPURL: f.cfg.HTTPURL,
		Version: f.cfg.Version, State: StateAlive, Since: f.cfg.Started, Started: f.cfg.Started,
	}}
	if f.cfg.Hosts != nil {
		out[0].Hosts = f.cfg.Hosts()
	}
	f.mu.Lock()
	peers := make([]*peer, 0, len(f.peers))
	for _, p := range f.peers {
		peers = append(peers, p)
	}
	f.mu.Unlock()
	for _, p := range peers {
		out = append(out, p.member(now))
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (p *peer) member(now time.Time) Member {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := Member{
		Name: p.name, ClusterAddr: p.addr, ClientURL: p.meta.Client, HTTPURL: p.meta.HTTP,
		Version: p.meta.Version, Hosts: p.meta.Hosts,
	}
	if p.meta.Started != 0 {
		m.Started = time.UnixMilli(p.meta.Started)
	}
	m.State, m.Since = p.stateLocked(now)
	m.Link = LinkStats{Up: p.up, Since: p.downSince, RTT: time.Duration(p.rtt.Load())}
	if p.up {
		m.Link.Since = p.upSince
	}
	m.Link.Control = p.stats[0].read()
	m.Link.Data = p.stats[1].read()
	m.Link.Cuts = LinkCuts{Silent: p.cuts[cutSilent].Load(), Stalled: p.cuts[cutStalled].Load(),
		Broken: p.cuts[cutBroken].Load(), Declared: p.cuts[cutDeclared].Load(), Other: p.cuts[cutOther].Load()}
	m.Link.Dropped = p.dropped.Load()
	return m
}

// stateLocked returns p's state and since when; p.mu is held.
func (p *peer) stateLocked(now time.Time) (string, time.Time) {
	switch {
	case p.ml == stateLeft:
		return StateLeft, p.mlSince
	case p.ml == stateDead:
		return StateDead, p.mlSince
	case p.up:
		return StateAlive, later(p.mlSince, p.upSince)
	case p.leaving:
		return StateLeft, p.downSince
	case p.refused:
		return StateDead, p.downSince
	case now.Sub(p.downSince) >= suspectAfter:
		return StateSuspect, p.downSince
	}
	return StateAlive, p.mlSince
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (c *linkCounters) read() LinkCounters {
	return LinkCounters{FramesOut: c.framesOut.Load(), FramesIn: c.framesIn.Load(), BytesOut: c.bytesOut.Load(), BytesIn: c.bytesIn.Load()}
}
