package broker

// ExchangeCount returns the number of exchanges, without a snapshot of
// each.
func (b *Broker) ExchangeCount() int {
	n := 0
	b.exchanges.Range(func(_, _ any) bool {
		n++
		return true
	})
	return n
}
