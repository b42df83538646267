package auth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/testutil"
)

// logins is a store with users alice and bob (passwords "alice-pw" and
// "bob-pw"), a clock the test moves, failure delays recorded instead of
// waited, and a log the test reads.
type logins struct {
	*Store
	mu        sync.Mutex // guards clock, delays, scheduled
	clock     time.Time
	delays    []time.Duration
	scheduled []func()
	log       *recorder
}

func newLogins(t *testing.T) *logins {
	t.Helper()
	l := &logins{clock: time.Unix(1_700_000_000, 0), log: &recorder{}}
	s, err := Open(Config{Dir: t.TempDir(), Log: slog.New(l.log)})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"alice", "bob"} {
		if _, err := s.PutUser(u, UserChange{Password: u + "-pw"}); err != nil {
			t.Fatal(err)
		}
	}
	s.wait = func(_ context.Context, d time.Duration) {
		l.mu.Lock()
		l.delays = append(l.delays, d)
		l.mu.Unlock()
	}
	s.throttle.now = func() time.Time {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.clock
	}
	s.throttle.schedule = func(_ time.Duration, f func()) {
		l.mu.Lock()
		l.scheduled = append(l.scheduled, f)
		l.mu.Unlock()
	}
	l.Store = s
	return l
}

// login tries user/password from peer and returns the delay its answer
// waited (-1 for none).
func (l *logins) login(peer, user, password string) (time.Duration, error) {
	l.mu.Lock()
	n := len(l.delays)
	l.mu.Unlock()
	_, err := l.Login(context.Background(), Attempt{User: user, Password: password, Peer: peer, Via: "test"})
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.delays) == n {
		return -1, err
	}
	return l.delays[n], err
}

// advance moves the clock and runs the flushes that were scheduled.
func (l *logins) advance(d time.Duration) {
	l.mu.Lock()
	l.clock = l.clock.Add(d)
	fs := l.scheduled
	l.scheduled = nil
	l.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// recorder is a slog.Handler that keeps the messages.
type recorder struct {
	mu   sync.Mutex // guards msgs
	msgs []string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.mu.Unlock()
	return nil
}

// take returns the messages logged since the last take.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.msgs
	r.msgs = nil
	return m
}

// TestHashPoolBoundsConcurrency: logins that need a password check run
// at most as many checks at once as the pool has slots; the others wait.
func TestHashPoolBoundsConcurrency(t *testing.T) {
	l := newLogins(t)
	l.pool = newHashPool(2, 100)
	gate := make(chan struct{})
	var in, most atomic.Int32
	l.onHash = func() {
		n := in.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-gate
		in.Add(-1)
	}
	const logins = 8
	var wg sync.WaitGroup
	for i := range logins {
		wg.Go(func() { l.login(fmt.Sprintf("10.0.0.%d:1", i), "alice", "wrong") })
	}
	testutil.WaitForf(t, 10*time.Second, func() bool { return in.Load() == 2 && l.pool.waiters() == logins-2 },
		"want 2 checks running and %d waiting; %d running, %d waiting", logins-2, in.Load(), l.pool.waiters())
	close(gate)
	wg.Wait()
	if m := most.Load(); m != 2 {
		t.Fatalf("%d password checks ran at once, the pool has 2 slots", m)
	}
	if s := HashSlots(); s < 1 {
		t.Fatalf("HashSlots() = %d", s)
	}
}

// TestHashPoolWaitIsBounded: past its queue a login fails at once with
// ErrBusy, and so does one whose deadline passes while it waits; a
// waiter from a source without failures goes before one from a suspect
// source.
func TestHashPoolWaitIsBounded(t *testing.T) {
	p := newHashPool(1, 2)
	ctx := context.Background()
	if err := p.acquire(ctx, laneHigh); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	go func() { p.acquire(ctx, laneLow); order <- "low"; p.release() }()
	testutil.WaitFor(t, 10*time.Second, func() bool { return p.waiters() == 1 })
	go func() { p.acquire(ctx, laneHigh); order <- "high"; p.release() }()
	testutil.WaitFor(t, 10*time.Second, func() bool { return p.waiters() == 2 })
	if err := p.acquire(ctx, laneHigh); !errors.Is(err, ErrBusy) {
		t.Fatalf("a login past the queue: %v, want ErrBusy", err)
	}
	p.release()
	if first := testutil.Recv(t, order, 10*time.Second); first != "high" {
		t.Fatalf("the %s lane was served first, want high", first)
	}
	testutil.Recv(t, order, 10*time.Second)

	if err := p.acquire(ctx, laneHigh); err != nil {
		t.Fatal(err)
	}
	expired, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.acquire(expired, laneHigh); !errors.Is(err, ErrBusy) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a login whose deadline passed: %v, want ErrBusy", err)
	}
	if p.waiters() != 0 {
		t.Fatalf("%d waiters left behind", p.waiters())
	}
	p.release()
	if err := p.acquire(ctx, laneHigh); err != nil {
		t.Fatalf("the slot was not given back: %v", err)
	}
}

// TestFailuresSlowDown: repeated failures from one address are answered
// later and later, up to the cap, while a correct password from it, and
// a failure from another address for another user, are answered at
// once; failures for one user name slow its guessers on other addresses;
// scores decay.
func TestFailuresSlowDown(t *testing.T) {
	l := newLogins(t)
	want := []time.Duration{0, 0, 0, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond,
		800 * time.Millisecond, 1600 * time.Millisecond, 2 * time.Second, 2 * time.Second}
	for i, w := range want {
		d, err := l.login("10.0.0.1:4000", "alice", "wrong")
		if !errors.Is(err, ErrBadCredentials) {
			t.Fatalf("failure %d: %v", i, err)
		}
		if d != w {
			t.Fatalf("failure %d answered after %v, want %v", i+1, d, w)
		}
	}
	if !l.throttle.suspect("10.0.0.1") {
		t.Fatal("the guessing address is not suspect")
	}
	if d, err := l.login("10.0.0.1:4001", "alice", "alice-pw"); err != nil || d != -1 {
		t.Fatalf("the correct password from the guessing address: delay %v, %v; want at once", d, err)
	}
	if d, err := l.login("10.0.0.2:4000", "bob", "wrong"); !errors.Is(err, ErrBadCredentials) || d != 0 {
		t.Fatalf("a first failure from another address: delay %v, %v; want none", d, err)
	}
	if d, err := l.login("10.0.0.3:4000", "alice", "wrong"); d != 2*time.Second {
		t.Fatalf("a guess at alice from a new address: delay %v, %v; want 2s (alice's failures)", d, err)
	}
	// IPv6: one /64 is one source.
	for i := range 4 {
		l.login(fmt.Sprintf("[2001:db8::%d]:4000", i+1), "bob", "wrong"+fmt.Sprint(i))
	}
	if !l.throttle.suspect(Source("[2001:db8::ffff]:1")) {
		t.Fatal("addresses of one IPv6 /64 are counted apart")
	}
	l.advance(10 * time.Minute)
	if l.throttle.suspect("10.0.0.1") {
		t.Fatal("the score does not decay")
	}
	if d, _ := l.login("10.0.0.1:4000", "bob", "wrong"); d != 0 {
		t.Fatalf("a failure 10 minutes later: delay %v, want none", d)
	}
}

// TestUnknownUserSamePath: an unknown user, a wrong password and an
// oversized password each cost one password check and a recorded
// failure, and fail with the same error.
func TestUnknownUserSamePath(t *testing.T) {
	l := newLogins(t)
	var hashes atomic.Int32
	l.onHash = func() { hashes.Add(1) }
	for _, c := range []struct {
		name, user, password string
		delay                time.Duration
	}{
		{"wrong password", "alice", "wrong", 0},
		{"unknown user", "mallory", "wrong", 0},
		{"invalid user name", strings.Repeat("x", 5000), "wrong", 0},
		{"oversized password", "alice", strings.Repeat("p", MaxPassword+1), firstDelay},
	} {
		before := hashes.Load()
		d, err := l.login("10.0.0.9:1", c.user, c.password)
		if err != ErrBadCredentials {
			t.Errorf("%s: %v, want ErrBadCredentials itself", c.name, err)
		}
		if n := hashes.Load() - before; n != 1 {
			t.Errorf("%s: %d password checks, want 1", c.name, n)
		}
		if d != c.delay {
			t.Errorf("%s: delay %v, want %v (the address's failure count)", c.name, d, c.delay)
		}
	}
	if d, _ := l.login("10.0.0.9:1", "nobody", "x"); d != 2*firstDelay {
		t.Fatalf("the fifth failure of the address: delay %v, want %v", d, 2*firstDelay)
	}
	// A good login is then remembered: no check the second time.
	l.login("10.0.0.8:1", "bob", "bob-pw")
	before := hashes.Load()
	if _, err := l.login("10.0.0.8:1", "bob", "bob-pw"); err != nil || hashes.Load() != before {
		t.Fatalf("a repeated good login: %v, %d checks", err, hashes.Load()-before)
	}
}

// TestFailureLogRateLimited: a flood of failures from one address logs
// its first failure, then one line per period saying how many followed;
// another address gets its own line; once a period passes without
// failures, the next one is logged in full again.
func TestFailureLogRateLimited(t *testing.T) {
	l := newLogins(t)
	l.pool = newHashPool(4, 1000)
	l.log.take()
	for range 50 {
		l.login("10.0.0.1:1", "alice", "wrong")
	}
	l.login("10.0.0.2:1", "bob", "wrong")
	if got := l.log.take(); len(got) != 2 || got[0] != "authentication failed" || got[1] != "authentication failed" {
		t.Fatalf("51 failures from 2 addresses logged %q, want one line per address", got)
	}
	l.advance(failureLogEvery)
	if got := l.log.take(); len(got) != 1 || got[0] != "49 failed logins from 10.0.0.1 in the last 10s" {
		t.Fatalf("at the end of the period: %q, want one summary for 10.0.0.1", got)
	}
	l.login("10.0.0.1:1", "alice", "wrong")
	if got := l.log.take(); len(got) != 0 {
		t.Fatalf("a failure in a period that follows a summary logged %q", got)
	}
	l.advance(failureLogEvery)
	if got := l.log.take(); len(got) != 1 || got[0] != "1 failed logins from 10.0.0.1 in the last 10s" {
		t.Fatalf("second period: %q", got)
	}
	l.advance(failureLogEvery) // a quiet period ends the summaries
	if got := l.log.take(); len(got) != 0 {
		t.Fatalf("a quiet period logged %q", got)
	}
	l.login("10.0.0.1:1", "alice", "wrong")
	if got := l.log.take(); len(got) != 1 || got[0] != "authentication failed" {
		t.Fatalf("after a quiet period: %q, want the failure in full", got)
	}
}

// TestThrottleBounded: failures from more sources and user names than
// it tracks do not grow its maps past the bound.
func TestThrottleBounded(t *testing.T) {
	th := newThrottle(slog.New(&recorder{}))
	th.schedule = func(time.Duration, func()) {}
	for i := range maxTracked + 500 {
		src := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		th.fail(src, src+":1", fmt.Sprintf("user%d", i), "test", ErrBadCredentials)
	}
	th.fail("x", "x:1", strings.Repeat("u", 100000), "test", ErrBadCredentials)
	if len(th.addrs) > maxTracked || len(th.users) > maxTracked {
		t.Fatalf("%d sources and %d user names tracked, bound %d", len(th.addrs), len(th.users), maxTracked)
	}
	if _, ok := th.users[invalidUser]; !ok {
		t.Fatal("an impossible user name is not kept under one key")
	}
}
