package admin

import (
	"strconv"
	"time"
)

// ClusterNode is a node of the cluster as the node serving the API sees
// it, for GET /api/nodes.
type ClusterNode struct {
	Name string
	// Self is the node serving the API.
	Self bool
	// State is alive, suspect, dead or left (docs/cluster.md); Since
	// when it began.
	State string
	Since time.Time
	// Started is when the node started (zero when unknown).
	Started                         time.Time
	ClusterAddr, ClientURL, HTTPURL string
	Version                         string
	// Connections, Exchanges and Queues are what the node hosts, as it
	// gossiped last (every 2 s when they change); for Self they are read
	// live.
	Connections, Exchanges, Queues int
	// MetaLeader is whether the node leads the metadata Raft group.
	MetaLeader bool
	// Links are the links of the node serving the API: with every peer
	// on the Self row, with that node on the others.
	Links []ClusterLink
}

// ClusterLink is the link of the node serving the API with a peer.
type ClusterLink struct {
	Peer string
	Up   bool
	// Since is when the link came up or went down last.
	Since time.Time
	// RTT is the round trip of the last link heartbeat.
	RTT           time.Duration
	Control, Data LinkCounters
	// Cuts count the sessions with the peer that ended, by cause.
	Cuts LinkCuts
	// Dropped counts the frames refused because the link's outbox was
	// past its offer limit (publications and requests wait instead).
	Dropped uint64
}

// LinkCuts count the ends of a node link's sessions by cause: silent
// (nothing heard, heartbeats included, for three link heartbeats),
// stalled (the peer took nothing for the slow-consumer timeout), broken
// (the connection failed), declared (memberlist declared the node dead
// or gone), other (the peer dialled again, the broker cut it, this node
// closed).
type LinkCuts struct {
	Silent, Stalled, Broken, Declared, Other uint64
}

// LinkCounters count a node link's frames and bytes each way.
type LinkCounters struct {
	FramesOut, FramesIn, BytesOut, BytesIn uint64
}

// running reports whether a node state counts as running.
func running(state string) bool { return state == "alive" || state == "suspect" }

func appendLinks(b []byte, ls []ClusterLink) []byte {
	b = append(b, '[')
	for i, l := range ls {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"peer":`...)
		b = appendString(b, l.Peer)
		b = append(b, `,"up":`...)
		b = strconv.AppendBool(b, l.Up)
		b = append(b, `,"since":`...)
		b = strconv.AppendInt(b, unixMilli(l.Since), 10)
		b = append(b, `,"rtt_ms":`...)
		b = appendFloat(b, float64(l.RTT)/float64(time.Millisecond))
		b = append(b, `,"control":`...)
		b = appendCounters(b, l.Control)
		b = append(b, `,"data":`...)
		b = appendCounters(b, l.Data)
		b = append(b, `,"cuts":{"silent":`...)
		b = strconv.AppendUint(b, l.Cuts.Silent, 10)
		b = append(b, `,"stalled":`...)
		b = strconv.AppendUint(b, l.Cuts.Stalled, 10)
		b = append(b, `,"broken":`...)
		b = strconv.AppendUint(b, l.Cuts.Broken, 10)
		b = append(b, `,"declared":`...)
		b = strconv.AppendUint(b, l.Cuts.Declared, 10)
		b = append(b, `,"other":`...)
		b = strconv.AppendUint(b, l.Cuts.Other, 10)
		b = append(b, `},"dropped":`...)
		b = strconv.AppendUint(b, l.Dropped, 10)
		b = append(b, '}')
	}
	return append(b, ']')
}

func appendCounters(b []byte, c LinkCounters) []byte {
	b = append(b, `{"frames_out":`...)
	b = strconv.AppendUint(b, c.FramesOut, 10)
	b = append(b, `,"frames_in":`...)
	b = strconv.AppendUint(b, c.FramesIn, 10)
	b = append(b, `,"bytes_out":`...)
	b = strconv.AppendUint(b, c.BytesOut, 10)
	b = append(b, `,"bytes_in":`...)
	b = strconv.AppendUint(b, c.BytesIn, 10)
	return append(b, '}')
}

func unixMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func (s *Server) clientURL() string {
	if s.cfg.ClientURL == nil {
		return ""
	}
	return s.cfg.ClientURL()
}

func (s *Server) httpURL() string {
	if s.cfg.HTTPURL == nil {
		return ""
	}
	return s.cfg.HTTPURL()
}
