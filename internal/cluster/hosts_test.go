package cluster

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestHostsGossiped: what a node hosts reaches the others within a few
// gossip intervals of a change.
func TestHostsGossiped(t *testing.T) {
	var conns atomic.Int64
	a, _ := startFabric(t, "a", nil, func(c *Config) {
		c.HostsInterval = 100 * time.Millisecond
		c.Hosts = func() Hosts { return Hosts{Connections: int(conns.Load()), Exchanges: 2} }
	})
	b, _ := startFabric(t, "b", []string{a.Advertise()}, nil)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })
	waitFor(t, 10*time.Second, "b sees a's exchanges", func() bool { return member(b, "a").Hosts.Exchanges == 2 })
	conns.Store(7)
	waitFor(t, 10*time.Second, "b sees a's connections", func() bool { return member(b, "a").Hosts.Connections == 7 })
	conns.Store(3)
	waitFor(t, 10*time.Second, "b sees a's connections change", func() bool { return member(b, "a").Hosts.Connections == 3 })
}
