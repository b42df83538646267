package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier"
)

// Dialer opens a connection named name, to an embedded node or a server;
// the rest of the code does not know which.
type Dialer func(ctx context.Context, name string) (*courier.Conn, error)

// Options tune the demo.
type Options struct {
	// Instances is how many copies of the users service run. Default: 3.
	Instances int
	// Gets is how many get requests the balancing phase sends. Default: 9.
	Gets int
	// Tick is the scheduler's job period. Default: 200ms.
	Tick time.Duration
	// Runs is how many jobs each leader runs before the demo moves on.
	// Default: 3.
	Runs int
	// Wait bounds each wait for something to happen. Default: 5s.
	Wait time.Duration
}

func (o *Options) defaults() {
	if o.Instances <= 0 {
		o.Instances = 3
	}
	if o.Gets <= 0 {
		o.Gets = 9
	}
	if o.Tick <= 0 {
		o.Tick = 200 * time.Millisecond
	}
	if o.Runs <= 0 {
		o.Runs = 3
	}
	if o.Wait <= 0 {
		o.Wait = 5 * time.Second
	}
}

// Report is what happened during the demo, for the tests.
type Report struct {
	Instances []string
	// Gets counts the get requests each instance served in the balancing
	// phase.
	Gets map[string]int
	// Copies is each instance's store at the end.
	Copies map[string]map[string]User
	// Notified lists the routing keys the notifier received.
	Notified []string
	// Schedulers names the first leader, then the one that took over.
	Schedulers [2]string
	// Runs lists the job runs of each scheduler.
	Runs map[string][]JobRun
	// Events lists the membership events the second scheduler received.
	Events []courier.Event
	// FirstID and SecondID are the schedulers' member ids.
	FirstID, SecondID string
	// Closing is just before the first leader's connection was closed;
	// Closed is just after.
	Closing, Closed time.Time
	// LeaderBefore and LeaderAfter name who answered a request to
	// "users.scheduler" before and after the handover.
	LeaderBefore, LeaderAfter string
}

// printer writes timestamped lines from any goroutine.
type printer struct {
	mu    sync.Mutex // guards w
	w     io.Writer
	start time.Time
}

func (p *printer) say(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%5.2fs  %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// seed is the users the demo creates.
var seed = []Op{
	{Op: "update", ID: "1", Name: "Ada Lovelace", Email: "ada@example.org"},
	{Op: "update", ID: "2", Name: "Grace Hopper", Email: "grace@example.org"},
	{Op: "update", ID: "3", Name: "Joe Armstrong", Email: "joe@example.org"},
}

// Demo runs the users service against whatever dial connects to, prints
// what happens on out, and returns a report. It closes every connection it
// opened before it returns.
func Demo(ctx context.Context, dial Dialer, out io.Writer, opts Options) (*Report, error) {
	opts.defaults()
	if err := checkFree(ctx, dial); err != nil {
		return nil, err
	}
	p := &printer{w: out, start: time.Now()}
	say := p.say
	rep := &Report{Gets: map[string]int{}, Copies: map[string]map[string]User{}, Runs: map[string][]JobRun{}}

	// Everything opened is closed, and its goroutines waited for, before
	// Demo returns, so that nothing prints afterwards.
	var atts []*courier.Attachment
	var loops []chan struct{}
	var closers []func()
	defer func() {
		for _, c := range closers {
			c()
		}
		for _, a := range atts {
			<-a.Done()
		}
		for _, d := range loops {
			<-d
		}
	}()

	say("== the users service: %d instances behind the round-robin exchange %q", opts.Instances, usersExchange)
	var instances []*Instance
	for i := range opts.Instances {
		in, err := StartInstance(ctx, dial, fmt.Sprintf("users-%d", i+1), say)
		if err != nil {
			return rep, err
		}
		closers = append(closers, in.Close)
		atts = append(atts, in.attachments()...)
		instances = append(instances, in)
		rep.Instances = append(rep.Instances, in.Name)
		say("%s: handling %q as %s, subscribed to %s profile.updated.*", in.Name, usersExchange, in.handler.ID(), eventsExchange)
	}
	notifier, err := StartNotifier(ctx, dial, say)
	if err != nil {
		return rep, err
	}
	closers = append(closers, notifier.Close)
	atts = append(atts, notifier.sub)
	say("notifier: subscribed to %s profile.updated.*", eventsExchange)

	front, err := dial(ctx, "frontend")
	if err != nil {
		return rep, err
	}
	closers = append(closers, func() { front.Close() })
	users, err := front.ReqResp(ctx, usersExchange, courier.RoundRobin)
	if err != nil {
		return rep, err
	}
	call := func(op Op) (Reply, error) {
		ctx, cancel := context.WithTimeout(ctx, opts.Wait)
		defer cancel()
		body, _ := json.Marshal(op)
		resp, err := users.Request(ctx, courier.Message{Body: body})
		if err != nil {
			return Reply{}, fmt.Errorf("%s %s: %w", op.Op, op.ID, err)
		}
		var r Reply
		if err := json.Unmarshal(resp.Body, &r); err != nil {
			return Reply{}, fmt.Errorf("%s %s: bad reply: %w", op.Op, op.ID, err)
		}
		return r, nil
	}
	// converged waits until every copy holds every user at least at the
	// version wanted.
	converged := func(want map[string]int) error {
		return waitFor(ctx, opts.Wait, func() bool {
			for _, in := range instances {
				c := in.Copy()
				for id, v := range want {
					if c[id].Version < v {
						return false
					}
				}
			}
			return true
		}, "every copy to hold versions %v", want)
	}

	say("== updates go out on %q; every copy applies them", eventsExchange)
	want := map[string]int{}
	for _, op := range seed {
		r, err := call(op)
		if err != nil {
			return rep, err
		}
		want[op.ID] = r.User.Version
		say("update user %s (%s) -> served by %s, now v%d", op.ID, op.Name, r.ServedBy, r.User.Version)
	}
	if err := converged(want); err != nil {
		return rep, err
	}
	say("all %d copies hold users %v", len(instances), slices.Sorted(maps.Keys(want)))

	say("== %d get requests, balanced round-robin", opts.Gets)
	for i := range opts.Gets {
		op := Op{Op: "get", ID: seed[i%len(seed)].ID}
		r, err := call(op)
		if err != nil {
			return rep, err
		}
		rep.Gets[r.ServedBy]++
		say("get user %s -> %s: %s <%s> v%d", op.ID, r.ServedBy, r.User.Name, r.User.Email, r.User.Version)
	}
	var spread []string
	for _, in := range instances {
		spread = append(spread, fmt.Sprintf("%s=%d", in.Name, rep.Gets[in.Name]))
	}
	say("gets served: %s", strings.Join(spread, " "))

	say("== a profile update")
	r, err := call(Op{Op: "update", ID: "2", Email: "grace.hopper@navy.example"})
	if err != nil {
		return rep, err
	}
	want["2"] = r.User.Version
	say("update user 2's e-mail -> served by %s, now v%d", r.ServedBy, r.User.Version)
	if err := converged(want); err != nil {
		return rep, err
	}
	if err := waitFor(ctx, opts.Wait, func() bool { return len(notifier.Keys()) >= len(seed)+1 }, "the notifier to get %d updates", len(seed)+1); err != nil {
		return rep, err
	}
	for _, in := range instances {
		u := in.Copy()["2"]
		say("%s's copy of user 2: %s v%d", in.Name, u.Email, u.Version)
	}

	say("== the scheduler: 2 instances on %q with the leader strategy", schedulerExchange)
	who, err := front.ReqResp(ctx, schedulerExchange, courier.Leader)
	if err != nil {
		return rep, err
	}
	ask := func() (string, error) {
		ctx, cancel := context.WithTimeout(ctx, opts.Wait)
		defer cancel()
		resp, err := who.Request(ctx, courier.Message{})
		if err != nil {
			return "", fmt.Errorf("ask the scheduler leader: %w", err)
		}
		return string(resp.Body), nil
	}
	var scheds [2]*Scheduler
	for i, name := range []string{"scheduler-a", "scheduler-b"} {
		s, err := StartScheduler(ctx, dial, name, opts.Tick, say)
		if err != nil {
			return rep, err
		}
		closers = append(closers, s.Close)
		atts = append(atts, s.att)
		loops = append(loops, s.done)
		scheds[i] = s
		rep.Schedulers[i] = name
		// Attach them one after the other, so that the first one leads.
		if err := waitFor(ctx, opts.Wait, func() bool { return s.att.Leader() != "" }, "%s to learn its leader", name); err != nil {
			return rep, err
		}
	}
	first, second := scheds[0], scheds[1]
	rep.FirstID, rep.SecondID = first.ID(), second.ID()
	if rep.LeaderBefore, err = ask(); err != nil {
		return rep, err
	}
	say("frontend: a request to %q is answered by %s", schedulerExchange, rep.LeaderBefore)
	if err := waitFor(ctx, opts.Wait, func() bool { return len(first.Runs()) >= opts.Runs }, "%s to run %d jobs", first.Name, opts.Runs); err != nil {
		return rep, err
	}

	say("== closing %s's connection, as if its node died", first.Name)
	rep.Closing = time.Now()
	first.Close()
	rep.Closed = time.Now()
	if err := waitFor(ctx, opts.Wait, func() bool { return len(second.Runs()) >= opts.Runs }, "%s to take over and run %d jobs", second.Name, opts.Runs); err != nil {
		return rep, err
	}
	if rep.LeaderAfter, err = ask(); err != nil {
		return rep, err
	}
	say("frontend: a request to %q is answered by %s", schedulerExchange, rep.LeaderAfter)

	// Stop everything before reading the final state.
	for _, c := range closers {
		c()
	}
	for _, a := range atts {
		<-a.Done()
	}
	for _, d := range loops {
		<-d
	}
	closers, atts, loops = nil, nil, nil
	for _, in := range instances {
		rep.Copies[in.Name] = in.Copy()
	}
	rep.Notified = notifier.Keys()
	for _, s := range scheds {
		rep.Runs[s.Name] = s.Runs()
	}
	rep.Events = second.Events()
	say("== done: %s ran %d jobs, then %s ran %d; the notifier got %d updates",
		first.Name, len(rep.Runs[first.Name]), second.Name, len(rep.Runs[second.Name]), len(rep.Notified))
	return rep, nil
}

// waitFor polls cond until it holds, the timeout passes or ctx ends.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool, format string, args ...any) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("waited %v for %s", timeout, fmt.Sprintf(format, args...))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
