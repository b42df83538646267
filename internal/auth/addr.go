package auth

import (
	"fmt"
	"net"
)

// Loopback reports whether a listen address ("host:port") can be reached
// only from this machine: 127.0.0.0/8, ::1 or localhost. An empty host
// ("":7400, all interfaces) is not loopback.
func Loopback(addr string) (bool, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("bad listen address %q: %w", addr, err)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}
