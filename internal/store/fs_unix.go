//go:build unix

package store

import (
	"os"
	"syscall"
)

// flock takes a non-blocking exclusive lock on f.
func flock(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}
