//go:build !unix

package store

import "os"

// flock does nothing where flock(2) does not exist.
func flock(*os.File) error { return nil }
