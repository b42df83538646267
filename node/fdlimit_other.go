//go:build !unix

package node

// fdLimit reports no limit where there is no RLIMIT_NOFILE.
func fdLimit() (soft, hard uint64, ok bool) { return 0, 0, false }
