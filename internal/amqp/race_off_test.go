//go:build !race

package amqp

// raceEnabled reports whether the race detector is on.
const raceEnabled = false
