// Package admin serves Courier's management HTTP listener: a JSON API in
// the shape RabbitMQ's management plugin made familiar (/api/overview,
// /api/exchanges, /api/queues, /api/connections, /api/nodes), Prometheus
// metrics (/metrics), Go's profiler (/debug/pprof/) and a web dashboard
// (/) built from embedded assets that reads the same API.
//
// Every figure comes from counters the broker keeps live (atomic loads):
// a request never scans messages nor waits for a busy goroutine. One
// sampler goroutine reads the counters once per sample interval and
// derives per-second rates; counts and totals are read at request time.
//
//	GET /api/exchanges?columns=name,message_stats.publish_details.rate&sort=name&page=1&page_size=50
//
// docs/operations.md is the reference of the endpoints and their JSON.
package admin

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/internal/buildinfo"
)

// DefaultListen is the management listener's default address.
const DefaultListen = "127.0.0.1:7480"

// Config configures a management Server.
type Config struct {
	// Listen is the TCP address of the management listener. Without
	// users it must be a loopback address (127.0.0.0/8, ::1 or
	// localhost): the API is then open to anyone who reaches it.
	// Default: "127.0.0.1:7480".
	Listen string
	// Users, once it has users, makes every request authenticate with
	// HTTP Basic and checks the user's tags (see access.go); it also
	// serves /api/users and /api/permissions. Default: nil (no access
	// control, loopback only; the users endpoints answer 501).
	Users *auth.Store
	// MetricsAuth makes /metrics ask for credentials (any user) too once
	// there are users. Default: false (open, for Prometheus scrapers).
	// /metrics/per-object, which names every exchange and queue, always
	// asks for a user with the monitoring or administrator tag once there
	// are users.
	MetricsAuth bool
	// TLS, when set, serves HTTPS only. Default: nil (plain HTTP).
	TLS *tls.Config
	// MaxConns bounds the connections open at once; past it new ones
	// wait in the kernel's backlog, costing no file descriptor, until one
	// closes. Default: DefaultMaxConns (256).
	MaxConns int
	// Broker is the broker to manage. Required.
	Broker *broker.Broker
	// Describe tells what a session's transport knows of its peer (see
	// [broker.Session.Sink]). It is called from request goroutines and
	// must not block. Default: nil, every connection shows as embedded.
	Describe func(broker.Sink) (ConnInfo, bool)
	// CloseConn closes the transport behind a session's sink, telling
	// its peer reason, for DELETE /api/connections/{id}; it returns false
	// for a sink it cannot close (an in-process connection). Default:
	// nil, no connection can be closed (501).
	CloseConn func(sink broker.Sink, reason string) bool
	// ConnEnds returns the counts of network connections that ended
	// abnormally (see [ConnEnds]), for /metrics and /api/nodes.
	// Default: nil, none counted (zeros).
	ConnEnds func() ConnEnds
	// Queues is the queue layer. Default: nil, no queues: the queue list
	// is empty and creating, deleting or purging a queue answers 501.
	Queues QueueSource
	// Replicas is the cluster's replicated queues: /api/queues shows
	// their leader and replicas, and the rebalance and member endpoints
	// move them. Default: nil (a node alone: no replicated queue, and
	// those endpoints answer 501).
	Replicas ReplicaSource
	// Node names the node. Default: the broker's node name.
	Node string
	// Version is the Courier version shown. Default: the module version
	// from the build information, or "devel".
	Version string
	// Listeners returns the node's other listeners for the overview, such
	// as the client protocol's. Default: nil.
	Listeners func() []Listener
	// SampleInterval is how often the sampler reads every counter and
	// computes rates. Default: 1s.
	SampleInterval time.Duration
	// History is how many samples the overview keeps for its rate charts
	// (?msg_rates_age=). Default: 600 (ten minutes at 1s).
	History int
	// Cluster returns the nodes of the cluster as this node sees it,
	// itself included, for /api/nodes. Default: nil, a single node.
	Cluster func() []ClusterNode
	// ForgetNode removes a node from the cluster for good (DELETE
	// /api/nodes/{name}): it leaves the metadata group and its exchanges
	// go to other nodes. Default: nil (a single node: 405).
	ForgetNode func(ctx context.Context, name string) error
	// ClientURL and HTTPURL are this node's URLs, shown by /api/nodes on
	// a single node. Default: none.
	ClientURL, HTTPURL func() string
	// Components returns the state of the node's supervised components
	// for the overview, the node and the metrics. Default: nil.
	Components func() []Component
	// Supervised, when set, makes New start no goroutine: the caller
	// runs [Server.RunSampler] itself, under a supervisor. Default: false.
	Supervised bool
	// WebSocket, when set, serves WebSocketPath (/ws): the client
	// protocol over WebSocket. It is outside the management API's access
	// control (a client authenticates in its HELLO) and its connections
	// leave the count of MaxConns once upgraded. Default: nil (404).
	WebSocket http.Handler
	// Log receives structured logs. Default: slog.Default().
	Log *slog.Logger

	// now returns the time; tests replace it.
	now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.Node == "" && c.Broker != nil {
		c.Node = c.Broker.Node()
	}
	if c.Version == "" {
		c.Version = buildinfo.Version()
	}
	if c.MaxConns <= 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.SampleInterval <= 0 {
		c.SampleInterval = time.Second
	}
	if c.History <= 0 {
		c.History = 600
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.now == nil {
		c.now = time.Now
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Broker == nil {
		return errors.New("admin: no broker")
	}
	if c.Listen != "" && (c.Users == nil || !c.Users.HasUsers()) {
		if err := CheckListen(c.Listen); err != nil {
			return err
		}
	}
	return nil
}

// CheckListen refuses a management listener address that other machines
// could reach, for a node without users: its API has no access control.
func CheckListen(addr string) error {
	local, err := auth.Loopback(addr)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	if !local {
		return fmt.Errorf("admin: listen address %q is not a loopback address: without users the management API has no access control, so it listens on 127.0.0.1, ::1 or localhost only; create users to listen elsewhere", addr)
	}
	return nil
}

// Server is the management HTTP server of one node.
type Server struct {
	cfg     Config
	b       *broker.Broker
	log     *slog.Logger
	smp     *sampler
	mux     *http.ServeMux
	handler http.Handler // mux behind guard
	started time.Time
	prof    *profiler
	metrics http.Handler // /metrics
	perObj  http.Handler // /metrics/per-object

	apiLatency *prometheus.HistogramVec

	stop     chan struct{} // closed by Shutdown to stop the sampler
	sampling chan struct{} // closed when the sampler has stopped
	once     sync.Once

	// httpConns counts the management listener's open connections.
	httpConns atomic.Int64

	mu   sync.Mutex // guards hs, ln, down
	hs   *http.Server
	ln   net.Listener
	down bool
}

// New returns a management server for cfg.Broker and starts its sampler.
// Serve it with [Server.Listen] and [Server.Serve], or mount
// [Server.Handler]; stop it with [Server.Shutdown].
func New(cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, b: cfg.Broker, log: cfg.Log, started: cfg.now(),
		smp:      newSampler(cfg.Broker, cfg.Queues, cfg.History, cfg.now),
		stop:     make(chan struct{}),
		sampling: make(chan struct{}),
	}
	s.prof = &profiler{}
	s.apiLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "courier_http_request_duration_seconds",
		Help:    "Response times of the management API, by endpoint.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"endpoint"})
	s.metrics, s.perObj = s.metricsHandlers()
	s.routes()
	s.smp.sample(s.started)
	if cfg.Supervised {
		close(s.sampling)
	} else {
		go func() {
			defer close(s.sampling)
			s.RunSampler(context.Background())
		}()
	}
	return s, nil
}

// RunSampler reads every counter once per Config.SampleInterval, for rates,
// until ctx ends or the server shuts down; it then returns nil. New runs
// it unless Config.Supervised is set.
func (s *Server) RunSampler(ctx context.Context) error {
	s.smp.run(ctx, s.cfg.SampleInterval, s.stop)
	return nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	api := func(pattern string, h http.HandlerFunc) {
		obs := s.apiLatency.WithLabelValues(pattern)
		m.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			h(w, r)
			obs.Observe(time.Since(start).Seconds())
		})
	}
	api("/api/overview", s.overview)
	api("/api/nodes", s.listNodes)
	api("/api/nodes/{name}", s.node)
	api("/api/exchanges", getOnly(s.listExchanges))
	api("/api/exchanges/{name}", s.exchange)
	api("/api/queues", getOnly(s.listQueues))
	api("/api/queues/{name}", s.queue)
	api("/api/queues/{name}/contents", s.purgeQueue)
	api("/api/queues/{name}/get", s.getMessages)
	api("POST /api/queues/rebalance", s.rebalanceQueues)
	api("POST /api/queues/grow", s.growQueues)
	api("POST /api/queues/shrink", s.shrinkQueues)
	api("POST /api/queues/{name}/members", s.queueMembers)
	api("DELETE /api/queues/{name}/members/{node}", s.queueMembers)
	api("/api/exchanges/{name}/publish", s.publish)
	api("/api/connections", getOnly(s.listConnections))
	api("/api/connections/{id}", s.connection)
	api("/api/connections/{node}/{id}", s.connection) // an id such as n1/c7, its '/' not escaped
	api("/api/whoami", getOnly(s.whoami))
	api("/api/users", getOnly(s.listUsers))
	api("/api/users/{name}", s.user)
	api("/api/permissions", getOnly(s.listPermissions))
	api("/api/permissions/{user}", s.permissions)
	api("/api/definitions", s.definitions)
	m.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, notFound("no API endpoint %s; see docs/operations.md", r.URL.Path))
	})
	m.Handle("/metrics", s.metrics)
	m.Handle("/metrics/per-object", s.perObj)
	s.prof.register(m)
	m.Handle("/", webHandler())
	s.mux = m
	guarded := s.guard(m)
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == WebSocketPath && s.cfg.WebSocket != nil {
			s.cfg.WebSocket.ServeHTTP(w, r)
			return
		}
		guarded.ServeHTTP(w, r)
	})
}

// WebSocketPath is where [Config.WebSocket] is served.
const WebSocketPath = "/ws"

// Handler returns the HTTP handler of every endpoint, behind the access
// control of [Config.Users].
func (s *Server) Handler() http.Handler { return s.handler }

// Listen opens the configured address; Serve then serves on it. Its
// errors wrap [ErrListen].
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("%w on %s: %w", ErrListen, s.cfg.Listen, err)
	}
	return ln, nil
}

// Addr returns the address being served, once Serve runs.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Serve serves the management API on ln until Shutdown; it then returns
// http.ErrServerClosed.
//
// At most Config.MaxConns connections are open at once. A request's
// header must arrive within 10 s (TLS handshake included) and hold at
// most 64 KiB; an idle keep-alive connection is closed after 2 minutes.
// There is no ReadTimeout: net/http would cancel the context of
// handlers that run longer (profiles and traces of /debug/pprof).
func (s *Server) Serve(ln net.Listener) error {
	ln = newLimitListener(ln, s.cfg.MaxConns, &s.httpConns)
	ln = &sniffListener{Listener: ln, reason: s.wrongPortReason}
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.mu.Lock()
	if s.down {
		s.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	s.hs, s.ln = hs, ln
	s.mu.Unlock()
	scheme := "http://"
	if s.cfg.TLS != nil {
		scheme = "https://"
	}
	s.log.Info("management API listening", "addr", ln.Addr().String(), "dashboard", scheme+ln.Addr().String()+"/",
		"tls", s.cfg.TLS != nil, "users", s.cfg.Users != nil && s.cfg.Users.HasUsers(), "max_connections", s.cfg.MaxConns)
	return hs.Serve(ln)
}

// Conns returns the number of open connections of the management
// listener.
func (s *Server) Conns() int { return int(s.httpConns.Load()) }

// Shutdown stops the sampler and the HTTP server, waiting for requests
// in progress until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.once.Do(func() { close(s.stop) })
	<-s.sampling
	s.mu.Lock()
	s.down = true
	hs := s.hs
	s.mu.Unlock()
	if hs == nil {
		return nil
	}
	err := hs.Shutdown(ctx)
	if err != nil {
		hs.Close()
	}
	return err
}

// listeners returns every listener of the node, this one included.
func (s *Server) listeners() []Listener {
	var ls []Listener
	if s.cfg.Listeners != nil {
		ls = append(ls, s.cfg.Listeners()...)
	}
	if a := s.Addr(); a != nil {
		ls = append(ls, Listener{Protocol: "http", Address: a.String()})
	}
	return ls
}

// getOnly refuses methods other than GET and HEAD.
func getOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET")
			return
		}
		h(w, r)
	}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	writeError(w, &apiError{http.StatusMethodNotAllowed, "method_not_allowed", "use " + strings.ReplaceAll(allow, ", ", " or ")})
}

func writeJSONBytes(w http.ResponseWriter, status int, b []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(status)
	w.Write(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSONBytes(w, status, b)
}

// writeError answers {"error": code, "reason": why} with the status the
// error maps to.
func writeError(w http.ResponseWriter, err error) {
	e := asAPIError(err)
	b := append([]byte(`{"error":`), appendString(nil, e.code)...)
	b = append(b, `,"reason":`...)
	b = appendString(b, e.reason)
	writeJSONBytes(w, e.status, append(b, '}'))
}
