package broker

// Routed reports whether a publication on the pub-sub exchange with key
// would reach a subscriber now, a durable subscription's queue included:
// the AMQP gateway's test of a mandatory publication. It is false when
// the exchange does not exist or is not pub-sub.
func (b *Broker) Routed(exchange, key string) bool {
	ex := b.Exchange(exchange)
	if ex == nil || ex.subs == nil {
		return false
	}
	return len(ex.match(key)) > 0
}
