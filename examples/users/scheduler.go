package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier"
)

// JobRun records one run of the scheduler's periodic job.
type JobRun struct {
	Scheduler string
	N         int // the run's number at that scheduler
	At        time.Time
}

// Scheduler is the users service's background scheduler. Every node runs
// one, but the job must run in a single copy: the schedulers attach to
// an exchange with the [courier.Leader] strategy, the broker appoints one
// of them, and each runs the job only while it is the leader.
type Scheduler struct {
	Name  string
	conn  *courier.Conn
	att   *courier.Attachment
	users *courier.ReqResp
	say   func(format string, args ...any)
	done  chan struct{} // closed when the job loop ends

	mu     sync.Mutex // guards runs, events
	runs   []JobRun
	events []courier.Event
}

// StartScheduler connects a scheduler, attaches it to "users.scheduler"
// and starts its job loop, which ticks every period.
func StartScheduler(ctx context.Context, dial Dialer, name string, every time.Duration, say func(string, ...any)) (*Scheduler, error) {
	conn, err := dial(ctx, name)
	if err != nil {
		return nil, err
	}
	s := &Scheduler{Name: name, conn: conn, say: say, done: make(chan struct{})}
	if err := s.attach(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	go s.loop(every)
	return s, nil
}

func (s *Scheduler) attach(ctx context.Context) error {
	ex, err := s.conn.ReqResp(ctx, schedulerExchange, courier.Leader)
	if err != nil {
		return err
	}
	s.users, err = s.conn.ReqResp(ctx, usersExchange, courier.RoundRobin)
	if err != nil {
		return err
	}
	// The attachment is also a handler: with the leader strategy, a
	// request to "users.scheduler" reaches only the leader, so anyone can
	// ask who runs the jobs.
	s.att, err = ex.Handle(ctx, func(r *courier.Request) {
		r.Reply([]byte(s.Name))
	}, courier.OnEvent(s.event), courier.Options(map[string]string{"name": s.Name}))
	return err
}

// event prints a membership event; members are shown by name.
func (s *Scheduler) event(e courier.Event) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
	var names []string
	for _, m := range e.Members {
		names = append(names, nameOf(m))
	}
	leader := e.Leader
	for _, m := range e.Members {
		if m.ID == e.Leader {
			leader = nameOf(m)
		}
	}
	what := ""
	if e.Member != nil && (e.Kind == courier.EventMemberUp || e.Kind == courier.EventMemberDown) {
		what = " " + nameOf(*e.Member)
	}
	s.say("%s: event %s%s: leader %s, members [%s], I lead: %v",
		s.Name, e.Kind, what, leader, strings.Join(names, " "), e.IsLeader)
}

func nameOf(m courier.Member) string {
	if n := m.Options["name"]; n != "" {
		return n + "(" + m.ID + ")"
	}
	return m.ID
}

// loop ticks until the attachment ends. On each tick it runs the job only
// if the broker has made this scheduler the leader.
func (s *Scheduler) loop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.att.Done():
			return
		case <-t.C:
		}
		if !s.att.IsLeader() {
			continue
		}
		s.job()
	}
}

// job is the periodic work: here, a digest of how many users there are,
// asked of the users service through its round-robin exchange.
func (s *Scheduler) job() {
	s.mu.Lock()
	run := JobRun{Scheduler: s.Name, N: len(s.runs) + 1, At: time.Now()}
	s.runs = append(s.runs, run)
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	body, _ := json.Marshal(Op{Op: "count"})
	resp, err := s.users.Request(ctx, courier.Message{Body: body})
	if errors.Is(err, courier.ErrClosed) {
		return // this scheduler is going away
	}
	if err != nil {
		s.say("%s: job #%d: %v", s.Name, run.N, err)
		return
	}
	var rep Reply
	json.Unmarshal(resp.Body, &rep)
	s.say("%s: job #%d (leader): digest: %d users (asked %s)", s.Name, run.N, rep.Count, rep.ServedBy)
}

// Runs returns the job runs so far.
func (s *Scheduler) Runs() []JobRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]JobRun(nil), s.runs...)
}

// Events returns the membership events received so far.
func (s *Scheduler) Events() []courier.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]courier.Event(nil), s.events...)
}

// IsLeader tells whether the scheduler leads.
func (s *Scheduler) IsLeader() bool { return s.att.IsLeader() }

// ID returns the scheduler's member id.
func (s *Scheduler) ID() string { return s.att.ID() }

// Close closes the scheduler's connection, as if its node died; the broker
// appoints another leader.
func (s *Scheduler) Close() { s.conn.Close() }
