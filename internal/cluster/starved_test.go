package cluster

import (
	"testing"
	"time"

	"github.com/courier-mq/courier/wire"
)

// TestStarvedLinkReaderIsNotSilence: a link whose read loop is behind
// (held here by a hook after it set its read deadline, as a loop starved
// of CPU is) while the peer keeps its heartbeat is not silent, and is not
// cut: the peer's frames wait in the socket. Before, the read that came
// after the deadline failed at once and the link was cut as "silent",
// losing what was queued on it.
func TestStarvedLinkReaderIsNotSilence(t *testing.T) {
	fast := func(c *Config) { c.LinkHeartbeat = 100 * time.Millisecond } // silent after 300 ms
	a, ra := startFabric(t, "a", nil, fast)
	b, rb := startFabric(t, "b", []string{a.Advertise()}, fast)
	waitFor(t, 20*time.Second, "a and b up", func() bool { return allUp(a, "a", "b") && allUp(b, "a", "b") })

	hold := make(chan struct{})
	held := make(chan struct{}, 1)
	hook := func(l *link) {
		if l.f != b || l.kind != KindLinkData {
			return
		}
		select {
		case held <- struct{}{}:
		default:
		}
		<-hold
	}
	testHookRead.Store(&hook)
	defer testHookRead.Store(nil)
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	// b's data link reader takes this frame, then stops at the hook.
	if err := a.Send("b", &wire.Frame{Type: wire.TypePublish, Name: "first"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("b's data link reader did not reach the hook")
	}
	// a's link heartbeats (a PING every 100 ms) and a publication wait in
	// b's socket for 2 s, well past the 300 ms of silence.
	if err := a.Send("b", &wire.Frame{Type: wire.TypePublish, Name: "second"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	testHookRead.Store(nil)
	close(hold)
	released = true
	waitFor(t, 20*time.Second, "b gets both frames", func() bool { return rb.count("a") == 2 })
	if ra.has("down b") || rb.has("down a") {
		t.Fatal("the link was cut while its peer kept its heartbeat")
	}
	if cuts := member(b, "a").Link.Cuts; cuts != (LinkCuts{}) {
		t.Fatalf("b counted cuts %+v, want none", cuts)
	}
}
