package auth

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"time"
)

// Failed logins are counted per source address and per user name, as a
// score that halves every failureHalfLife. Past freeFailures, each
// failure is answered late, by a delay that doubles with each failure up
// to maxFailureDelay: a guesser waits for its answers (holding one of its
// address's few handshake places while it does), a user who mistyped
// twice does not. Successes are never delayed.
const (
	failureHalfLife = time.Minute
	freeFailures    = 3
	firstDelay      = 100 * time.Millisecond
	maxFailureDelay = 2 * time.Second
	// maxTracked bounds each map of scores: past it, scores that have
	// decayed away go first, then arbitrary ones.
	maxTracked = 10000
	// failureLogEvery is the period of the failed-login log: the first
	// failure from a source is logged in full, the others of the period
	// in one line at its end.
	failureLogEvery = 10 * time.Second
)

// invalidUser is the key of every user name that cannot exist, so that
// names an attacker makes up take one entry, whatever their length.
const invalidUser = "\x00invalid"

// throttle counts failed logins, says how late to answer them, and keeps
// their log to a line per source per period.
type throttle struct {
	log *slog.Logger
	// now and schedule are time.Now and time.AfterFunc; tests replace
	// them.
	now      func() time.Time
	schedule func(time.Duration, func())

	mu        sync.Mutex // guards the fields below
	addrs     map[string]*failures
	users     map[string]*failures
	flushing  bool      // a flush of the log is scheduled
	lastSweep time.Time // of a full map
}

// failures is the record of one source or user name.
type failures struct {
	score float64   // failures, decayed to at
	at    time.Time // of the last failure
	// For sources: the log period in progress (zero: none), the failures
	// of it not logged yet, and the last user name they tried.
	period   time.Time
	unlogged int
	lastUser string
}

func newThrottle(log *slog.Logger) *throttle {
	return &throttle{
		log: log, now: time.Now, schedule: func(d time.Duration, f func()) { time.AfterFunc(d, f) },
		addrs: make(map[string]*failures), users: make(map[string]*failures),
	}
}

// decayed returns the score at now.
func (f *failures) decayed(now time.Time) float64 {
	return f.score * math.Exp2(-now.Sub(f.at).Seconds()/failureHalfLife.Seconds())
}

// delayFor is how late a failure is answered at a score.
func delayFor(score float64) time.Duration {
	n := int(math.Round(score))
	if n <= freeFailures {
		return 0
	}
	return min(maxFailureDelay, firstDelay<<min(n-freeFailures-1, 20))
}

// suspect reports whether source failed more than freeFailures times
// lately: its logins wait behind the others for a password check.
func (t *throttle) suspect(source string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	f := t.addrs[source]
	return f != nil && math.Round(f.decayed(t.now())) > freeFailures
}

// fail records a failed login of user from source (peer is its
// "host:port" for the log, via the listener) and returns how late to
// answer it.
func (t *throttle) fail(source, peer, user, via string, err error) time.Duration {
	now := t.now()
	t.mu.Lock()
	a := t.record(t.addrs, source, now)
	u := t.record(t.users, userKey(user), now)
	delay := max(delayFor(a.score), delayFor(u.score))
	logFull := a.period.IsZero()
	if logFull {
		a.period = now
	} else {
		a.unlogged++
		a.lastUser = user
	}
	if !t.flushing {
		t.flushing = true
		t.schedule(failureLogEvery, t.flushNow)
	}
	t.mu.Unlock()
	if logFull {
		t.log.Warn("authentication failed", "peer", peer, "user", user, "via", via, "err", err, "delay", delay)
	}
	return delay
}

// record adds a failure to key's record in m, making room if needed.
// t.mu is held.
func (t *throttle) record(m map[string]*failures, key string, now time.Time) *failures {
	f := m[key]
	if f == nil {
		if len(m) >= maxTracked {
			t.makeRoom(m, now)
		}
		f = &failures{}
		m[key] = f
	}
	f.score = f.decayed(now) + 1
	f.at = now
	return f
}

// makeRoom drops the records that decayed away, at most once a second,
// and else one arbitrary record. t.mu is held.
func (t *throttle) makeRoom(m map[string]*failures, now time.Time) {
	if now.Sub(t.lastSweep) >= time.Second {
		t.lastSweep = now
		t.sweep(m, now)
		if len(m) < maxTracked {
			return
		}
	}
	for k := range m {
		delete(m, k)
		return
	}
}

// sweep drops the records whose score decayed away and whose log has
// nothing pending. t.mu is held.
func (t *throttle) sweep(m map[string]*failures, now time.Time) {
	for k, f := range m {
		if f.period.IsZero() && f.decayed(now) < 0.5 {
			delete(m, k)
		}
	}
}

func (t *throttle) flushNow() { t.flush(t.now()) }

// flush ends the log periods that are over: a source with failures not
// logged yet gets one line saying how many, and a new period; one
// without ends its period (its next failure is logged in full). It also
// drops records that decayed away.
func (t *throttle) flush(now time.Time) {
	type line struct {
		source, user string
		n            int
	}
	var lines []line
	t.mu.Lock()
	t.flushing = false
	open := false
	for source, f := range t.addrs {
		switch {
		case f.period.IsZero():
		case now.Sub(f.period) < failureLogEvery:
			open = true
		case f.unlogged > 0:
			lines = append(lines, line{source, f.lastUser, f.unlogged})
			f.period, f.unlogged, open = now, 0, true
		default:
			f.period = time.Time{}
		}
	}
	t.sweep(t.addrs, now)
	t.sweep(t.users, now)
	if open {
		t.flushing = true
		t.schedule(failureLogEvery, t.flushNow)
	}
	t.mu.Unlock()
	for _, l := range lines {
		t.log.Warn(fmt.Sprintf("%d failed logins from %s in the last %s", l.n, l.source, failureLogEvery),
			"addr", l.source, "failures", l.n, "last_user", l.user)
	}
}

// userKey is the key of a user name in the scores.
func userKey(user string) string {
	if CheckName(user) != nil {
		return invalidUser
	}
	return user
}

// Source returns the key under which failed logins from addr ("host:port"
// or a bare host) are counted: the IPv4 address, or the /64 of an IPv6
// address (what one host is usually given). "" stays "" (in-process).
func Source(addr string) string {
	if addr == "" {
		return ""
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip4 := ip.To4(); ip4 != nil {
		return ip4.String()
	}
	return (&net.IPNet{IP: ip.Mask(net.CIDRMask(64, 128)), Mask: net.CIDRMask(64, 128)}).String()
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}
