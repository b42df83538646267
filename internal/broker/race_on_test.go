//go:build race

package broker

// raceEnabled: the race detector empties sync.Pools at random, which CEL
// draws its evaluation frames from, so allocation figures mean nothing.
const raceEnabled = true
