//go:build !linux

package store

import (
	"errors"
	"os"
)

// datasync is fsync where fdatasync is not available.
func datasync(f *os.File) error { return f.Sync() }

// freeSpace is not implemented here: the disk alarm stays off.
func freeSpace(string) (int64, error) { return 0, errors.ErrUnsupported }
