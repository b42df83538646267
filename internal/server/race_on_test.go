//go:build race

package server_test

// raceEnabled: the race detector doubles the runtime's stack guard and
// grows frames, so goroutines start with 4 KiB, not 2.
const raceEnabled = true
