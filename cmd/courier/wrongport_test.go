package main

import (
	"net"
	"strings"
	"testing"
)

// TestCLIWrongPort: pointed at the other port, a command says which port
// to use, at once: a client command at the management port, a
// management command at the client port. Each is given a --timeout far
// beyond cliWait, so that waiting it out fails the test.
func TestCLIWrongPort(t *testing.T) {
	url, api := adminServer(t)
	httpAddr := strings.TrimPrefix(api, "http://")
	clientAddr := strings.TrimPrefix(url, "courier://")
	cliFails(t, exitConnect, []string{"req", "x", "ping", "--url", "courier://" + httpAddr, "--timeout", "10m"},
		"management HTTP port", "clients connect to "+url)
	cliFails(t, exitConnect, []string{"overview", "--api", "http://" + clientAddr, "--timeout", "10m"},
		"client port", "the management API and dashboard are at "+api)
	// The server goes on serving both.
	cliOK(t, "exchanges", "--url", url)
	cliOK(t, "overview", "--api", api)
}

// TestCLIWrongPortOtherHTTP: a client command at any HTTP server that
// answers says it is a web port.
func TestCLIWrongPortOtherHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
			c.Close()
		}
	}()
	cliFails(t, exitConnect, []string{"pub", "x", "k", "--url", "courier://" + ln.Addr().String(), "--timeout", "10m"},
		"answered in HTTP", "not a Courier client port")
}
