//go:build race

package amqp

// raceEnabled: the race detector drops sync.Pool items at random, which
// the method codecs come from, so allocation counts mean nothing.
const raceEnabled = true
