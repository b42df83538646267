//go:build !linux

package wsnet

// unsentFD cannot tell on this system.
func unsentFD(uintptr) int { return -1 }
