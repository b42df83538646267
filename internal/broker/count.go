package broker

import "sync/atomic"

// exchangeCount is a count of the broker's exchanges at an exVersion.
type exchangeCount struct {
	version uint64
	n       int
}

// exchangeCounts counts the walks of the exchange table ExchangeCount
// made, for tests.
var exchangeCounts atomic.Uint64

// ExchangeCount returns the number of exchanges, without a snapshot of
// each. The count is walked again only when an exchange was declared or
// deleted since the last: a node with 10,000 exchanges is asked it
// several times a second (gossip, the metadata group's reconciliation),
// and a walk of 10,000 map entries each time was the largest part of an
// idle cluster's CPU.
func (b *Broker) ExchangeCount() int {
	v := b.exVersion.Load()
	if c := b.exCount.Load(); c != nil && c.version == v {
		return c.n
	}
	exchangeCounts.Add(1)
	n := 0
	b.exchanges.Range(func(_, _ any) bool {
		n++
		return true
	})
	if b.exVersion.Load() == v {
		// Nothing changed during the walk: n is the count at v.
		b.exCount.Store(&exchangeCount{version: v, n: n})
	}
	return n
}
