package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/node"
	"github.com/courier-mq/courier/wire"
)

// TestLoginFloodLoad measures what a wrong-password flood does to
// everyone else: 16 connections from 127.0.0.2 guess the admin's
// password as fast as the server answers, while a well-behaved client
// from 127.0.0.1 sends requests and new users log in for the first time.
// It prints the figures; it is run by hand (docs/operations.md, Security):
//
//	COURIER_LOGIN_FLOOD=1 go test -run TestLoginFloodLoad -v -count=1 ./internal/server/
func TestLoginFloodLoad(t *testing.T) {
	if os.Getenv("COURIER_LOGIN_FLOOD") == "" {
		t.Skip("set COURIER_LOGIN_FLOOD=1 to run this measurement")
	}
	const guessers, newUsers = 16, 12
	dir := t.TempDir()
	st, err := auth.Open(auth.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	all := auth.FullAccess()
	for i := range newUsers + 1 {
		name := fmt.Sprintf("u%d", i)
		if _, err := st.PutUser(name, auth.UserChange{Password: "pw-" + name, Permissions: &all, Tags: []string{auth.TagAdministrator}}); err != nil {
			t.Fatal(err)
		}
	}
	var logLines atomic.Int64
	log := slog.New(slog.NewTextHandler(countWriter{&logLines}, nil))
	n, err := node.Start(node.Config{DataDir: dir, Listen: "127.0.0.1:0", Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx := context.Background()
	opts := client.Options{User: "u0", Password: "pw-u0"}
	hc, err := client.Dial(ctx, n.URL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	h, err := hc.ReqResp(ctx, "echo", courier.RoundRobin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(ctx, func(r *courier.Request) { r.Reply(r.Body()) }); err != nil {
		t.Fatal(err)
	}
	rc, err := client.Dial(ctx, n.URL(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ex, err := rc.ReqResp(ctx, "echo")
	if err != nil {
		t.Fatal(err)
	}

	measure := func(label string, d time.Duration, firstUser int) {
		var lat []time.Duration
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			start := time.Now()
			if _, err := ex.Request(ctx, courier.Message{Body: []byte("x")}); err != nil {
				t.Fatalf("request: %v", err)
			}
			lat = append(lat, time.Since(start))
			time.Sleep(time.Millisecond)
		}
		var logins []time.Duration
		for i := firstUser; i < firstUser+newUsers/2; i++ {
			name := fmt.Sprintf("u%d", i)
			start := time.Now()
			c, err := client.Dial(ctx, n.URL(), client.Options{User: name, Password: "pw-" + name})
			if err != nil {
				t.Fatalf("login of %s: %v", name, err)
			}
			logins = append(logins, time.Since(start))
			c.Close()
		}
		slices.Sort(lat)
		slices.Sort(logins)
		t.Logf("%s: requests %d, p50 %v, p99 %v; first logins p50 %v, max %v; peak RSS %d MiB; log lines so far %d",
			label, len(lat), lat[len(lat)/2], lat[len(lat)*99/100], logins[len(logins)/2], logins[len(logins)-1], rssMiB(), logLines.Load())
	}
	measure("quiet", 3*time.Second, 1)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var guesses atomic.Int64
	for g := range guessers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if guess(n.Addr().String(), "u0", fmt.Sprintf("guess-%d-%d", g, i)) {
					guesses.Add(1)
				}
			}
		}()
	}
	time.Sleep(time.Second) // the flood settles
	before := guesses.Load()
	start := time.Now()
	measure("flood", 5*time.Second, 1+newUsers/2)
	t.Logf("flood: %.1f wrong guesses answered per second; GOMAXPROCS %d", float64(guesses.Load()-before)/time.Since(start).Seconds(), runtime.GOMAXPROCS(0))
	close(stop)
	wg.Wait()
}

// guess logs in from 127.0.0.2 with a password, as a raw client, and
// reports whether the server answered (with anything).
func guess(addr, user, password string) bool {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	body, _ := json.Marshal(wire.Hello{Versions: []int{wire.Version}, User: user, Password: password})
	p, _ := wire.AppendFrame(nil, &wire.Frame{Type: wire.TypeHello, Body: body}, 0)
	if _, err := c.Write(p); err != nil {
		return false
	}
	var f wire.Frame
	return wire.NewReader(c, 1<<16).Next(&f) == nil
}

type countWriter struct{ n *atomic.Int64 }

func (w countWriter) Write(p []byte) (int, error) {
	w.n.Add(int64(strings.Count(string(p), "\n")))
	return len(p), nil
}

// rssMiB is the process's peak resident memory in MiB, from /proc (0 where
// there is none).
func rssMiB() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), &kb)
			return kb / 1024
		}
	}
	return 0
}
