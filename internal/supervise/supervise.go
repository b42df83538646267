// Package supervise runs a node's long-lived components (listeners, the
// broker's sweeper, the management sampler) under a supervisor with a
// restart intensity limit, as OTP does: a component that crashes (returns
// an error or panics) is restarted, but one that crashes more than
// MaxRestarts times within Window is not restarted again; it is marked
// failed instead of looping. When a failed component is critical, the
// supervisor reports it on [Supervisor.Failed], so that the process can
// exit and let its service manager (systemd, Kubernetes) restart it.
//
// The restarts themselves are thejerf/suture's; this package adds the
// per-component intensity limit, the states the management API shows,
// and a short, growing delay between restarts.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/thejerf/suture/v4"
)

// State is where a component is in its life.
type State string

// Component states.
const (
	Running    State = "running"    // serving
	Restarting State = "restarting" // crashed; waiting to start again
	Failed     State = "failed"     // crashed too often; not restarted
	Stopped    State = "stopped"    // ended on its own (returned nil) or stopped with the node
)

// Component is one long-lived part of a node.
type Component struct {
	// Name names the component in logs, the API and metrics, such as
	// "listener".
	Name string
	// Critical says the node cannot serve without it: its failure is
	// reported on [Supervisor.Failed].
	Critical bool
	// Run serves until ctx ends and then returns nil. Returning nil
	// earlier means the component is done (it is not restarted);
	// returning an error or panicking is a crash. Run is called again on
	// each restart, from a new goroutine.
	Run func(ctx context.Context) error
}

// Status is a component's state for the management API.
type Status struct {
	Name     string
	Critical bool
	State    State
	// Restarts counts the restarts since the node started.
	Restarts uint64
	// LastError is the last crash's error or panic; "" for none.
	LastError string
	// Since is when the component entered State.
	Since time.Time
}

// Config configures a Supervisor.
type Config struct {
	// MaxRestarts is how many restarts a component may have within
	// Window; one more crash marks it failed. Default: 5.
	MaxRestarts int
	// Window is the restart intensity period. Default: 60s.
	Window time.Duration
	// RestartDelay is the wait before the first restart after a crash; it
	// doubles with each crash within Window, up to 5s. Default: 100ms.
	RestartDelay time.Duration
	// StopTimeout bounds the wait for a component to stop when the
	// supervisor stops. Default: 5s.
	StopTimeout time.Duration
	// Log receives crashes, restarts and failures. Default:
	// slog.Default().
	Log *slog.Logger

	// now returns the time; tests replace it.
	now func() time.Time
}

func (c *Config) setDefaults() {
	if c.MaxRestarts <= 0 {
		c.MaxRestarts = 5
	}
	if c.Window <= 0 {
		c.Window = 60 * time.Second
	}
	if c.RestartDelay <= 0 {
		c.RestartDelay = 100 * time.Millisecond
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
}

// maxRestartDelay caps the growing delay between restarts.
const maxRestartDelay = 5 * time.Second

// Supervisor runs components. Add them, then Start; Stop ends them all.
type Supervisor struct {
	cfg Config
	log *slog.Logger
	sup *suture.Supervisor

	mu     sync.Mutex // guards comps
	comps  []*service
	failed chan error // one send: the first critical failure

	cancel   context.CancelFunc
	done     <-chan error // from suture's ServeBackground
	stopOnce sync.Once
}

// New returns a supervisor with no components.
func New(cfg Config) *Supervisor {
	cfg.setDefaults()
	s := &Supervisor{cfg: cfg, log: cfg.Log, failed: make(chan error, 1)}
	s.sup = suture.New("courier", suture.Spec{
		EventHook: s.event,
		// The intensity limit is ours, per component: suture must never
		// pause every component for the crashes of one.
		FailureThreshold: 1e9,
		Timeout:          cfg.StopTimeout,
	})
	return s
}

// Add adds a component; it starts at once if the supervisor runs.
func (s *Supervisor) Add(c Component) {
	sv := &service{c: c, s: s, state: Running, since: s.cfg.now()}
	s.mu.Lock()
	s.comps = append(s.comps, sv)
	s.mu.Unlock()
	s.sup.Add(sv)
}

// Start runs the components until Stop.
func (s *Supervisor) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = s.sup.ServeBackground(ctx)
}

// Stop stops every component and waits for them, each for at most
// Config.StopTimeout. Calls after the first return at once.
func (s *Supervisor) Stop() {
	if s.cancel == nil {
		return
	}
	s.stopOnce.Do(func() {
		s.cancel()
		<-s.done
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sv := range s.comps {
		if sv.state != Failed {
			sv.setState(Stopped, s.cfg.now())
		}
	}
}

// Failed receives one error when a critical component has failed.
func (s *Supervisor) Failed() <-chan error { return s.failed }

// Status returns every component's state, in the order they were added.
func (s *Supervisor) Status() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Status, len(s.comps))
	for i, sv := range s.comps {
		out[i] = Status{
			Name: sv.c.Name, Critical: sv.c.Critical, State: sv.state,
			Restarts: sv.restarts, LastError: sv.lastErr, Since: sv.since,
		}
	}
	return out
}

// event logs what suture reports that this package does not: a component
// that does not stop in time.
func (s *Supervisor) event(e suture.Event) {
	if e.Type() == suture.EventTypeStopTimeout {
		s.log.Error("component did not stop in time", "event", e.String())
	}
}

// service adapts a Component to suture and keeps its state.
type service struct {
	c Component
	s *Supervisor

	// guarded by s.mu
	state    State
	since    time.Time
	restarts uint64
	lastErr  string
	crashes  []time.Time // within the window, oldest first
}

var _ suture.Service = (*service)(nil)

func (sv *service) String() string { return sv.c.Name }

// setState changes the state; s.mu is held.
func (sv *service) setState(st State, now time.Time) {
	if sv.state != st {
		sv.state, sv.since = st, now
	}
}

// Serve runs the component once. suture calls it again after a crash;
// it ends the component for good with ErrDoNotRestart.
func (sv *service) Serve(ctx context.Context) error {
	s := sv.s
	if d := sv.delay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
	s.mu.Lock()
	sv.setState(Running, s.cfg.now())
	s.mu.Unlock()
	err := sv.run(ctx)
	if ctx.Err() != nil {
		return nil // stopped with the supervisor
	}
	if err == nil {
		s.mu.Lock()
		sv.setState(Stopped, s.cfg.now())
		s.mu.Unlock()
		s.log.Info("component ended", "component", sv.c.Name)
		return suture.ErrDoNotRestart
	}
	return sv.crashed(err)
}

// run calls Run, turning a panic into an error.
func (sv *service) run(ctx context.Context) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
			sv.s.log.Error("component panicked", "component", sv.c.Name, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	return sv.c.Run(ctx)
}

// delay returns how long to wait before a restart: none for the first
// start, then RestartDelay doubled for each further crash in the window.
func (sv *service) delay() time.Duration {
	s := sv.s
	s.mu.Lock()
	n := len(sv.crashes)
	s.mu.Unlock()
	if n == 0 {
		return 0
	}
	d := s.cfg.RestartDelay
	for i := 1; i < n && d < maxRestartDelay; i++ {
		d *= 2
	}
	return min(d, maxRestartDelay)
}

// crashed records a crash and decides: restart, or fail for good.
func (sv *service) crashed(err error) error {
	s := sv.s
	now := s.cfg.now()
	s.mu.Lock()
	sv.lastErr = err.Error()
	keep := sv.crashes[:0]
	for _, t := range sv.crashes {
		if now.Sub(t) < s.cfg.Window {
			keep = append(keep, t)
		}
	}
	sv.crashes = append(keep, now)
	if len(sv.crashes) > s.cfg.MaxRestarts {
		sv.setState(Failed, now)
		s.mu.Unlock()
		ferr := fmt.Errorf("component %s failed: it crashed %d times within %s (more than the %d restarts allowed); the last crash: %w",
			sv.c.Name, len(sv.crashes), s.cfg.Window, s.cfg.MaxRestarts, err)
		s.log.Error("component failed; not restarting it", "component", sv.c.Name, "critical", sv.c.Critical, "err", ferr)
		if sv.c.Critical {
			select {
			case s.failed <- ferr:
			default:
			}
		}
		return errors.Join(suture.ErrDoNotRestart, ferr)
	}
	sv.restarts++
	sv.setState(Restarting, now)
	n := len(sv.crashes)
	s.mu.Unlock()
	s.log.Warn("component crashed; restarting it", "component", sv.c.Name, "err", err,
		"crashes_in_window", n, "max_restarts", s.cfg.MaxRestarts, "window", s.cfg.Window)
	return err
}
