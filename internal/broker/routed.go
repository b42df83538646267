package broker

// Routed reports whether a publication on the pub-sub exchange with key
// and header would reach a subscriber now, a durable subscription's
// queue included (through its header filters): the AMQP gateway's test
// of a mandatory publication. It is false when the exchange does not
// exist or is not pub-sub.
func (b *Broker) Routed(exchange, key string, header map[string]string) bool {
	ex := b.Exchange(exchange)
	if ex == nil || ex.subs == nil {
		return false
	}
	for _, a := range ex.match(key) {
		if bs, ok := a.s.sink.(bindingSink); !ok || bs.tq.admits(header) {
			return true
		}
	}
	return false
}
