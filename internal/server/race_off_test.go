//go:build !race

package server_test

// raceEnabled is set in a build with the race detector.
const raceEnabled = false
