package admin

import (
	"cmp"
	"fmt"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strconv"
	"sync"
)

// Rates a profile request turns on for its duration: one mutex
// contention event in 10, and one blocking event per 10µs spent blocked.
const (
	defaultMutexFraction = 10
	defaultBlockRate     = 10_000
)

// profiler serves Go's pprof endpoints. Mutex and block profiling cost
// time on every contended lock and blocking operation, so they are off
// and a request turns them on only for as long as it records
// (/debug/pprof/mutex?seconds=30).
type profiler struct {
	mu         sync.Mutex // guards the fields below and the runtime rates
	mutexUsers int        // requests recording a mutex profile now
	mutexPrev  int        // the mutex fraction before the first of them
	blockUsers int        // requests recording a block profile now
	mutexEver  bool       // mutex profiling has been on
	blockEver  bool       // block profiling has been on
}

func (p *profiler) register(m *http.ServeMux) {
	m.HandleFunc("/debug/pprof/", pprof.Index)
	m.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	m.HandleFunc("/debug/pprof/profile", pprof.Profile)
	m.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	m.HandleFunc("/debug/pprof/trace", pprof.Trace)
	m.HandleFunc("/debug/pprof/mutex", p.serve("mutex"))
	m.HandleFunc("/debug/pprof/block", p.serve("block"))
}

// serve serves the mutex or block profile. With ?seconds=N it turns
// profiling on at ?rate= (or the default) unless it is on already,
// records for N seconds and turns it off again. Without seconds it serves
// what was recorded so far, or, when profiling was never on, says how to
// turn it on rather than send an empty profile.
func (p *profiler) serve(kind string) http.HandlerFunc {
	h := pprof.Handler(kind)
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		rate := 0
		if s := q.Get("rate"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				profileError(w, http.StatusBadRequest, fmt.Sprintf("rate=%q: want a positive integer", s))
				return
			}
			rate = n
		}
		secs := q.Get("seconds")
		if secs == "" {
			if !p.recorded(kind) {
				profileError(w, http.StatusBadRequest, fmt.Sprintf(
					"%s profiling is off (it slows the broker down): ask for /debug/pprof/%s?seconds=30 to record 30 seconds", kind, kind))
				return
			}
			h.ServeHTTP(w, r)
			return
		}
		if n, err := strconv.Atoi(secs); err != nil || n < 1 {
			profileError(w, http.StatusBadRequest, fmt.Sprintf("seconds=%q: want a positive integer", secs))
			return
		}
		release := p.acquire(kind, rate)
		defer release()
		h.ServeHTTP(w, r)
	}
}

// recorded reports whether the kind of profiling is or has been on.
func (p *profiler) recorded(kind string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kind == "mutex" {
		return p.mutexEver || runtime.SetMutexProfileFraction(-1) > 0
	}
	return p.blockEver
}

// acquire turns the kind of profiling on, unless a request already did,
// until release.
func (p *profiler) acquire(kind string, rate int) (release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if kind == "mutex" {
		if p.mutexUsers == 0 {
			// Leave a fraction someone else set alone.
			if p.mutexPrev = runtime.SetMutexProfileFraction(-1); p.mutexPrev == 0 {
				runtime.SetMutexProfileFraction(cmp.Or(rate, defaultMutexFraction))
			}
		}
		p.mutexUsers++
		p.mutexEver = true
		return func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.mutexUsers--; p.mutexUsers == 0 && p.mutexPrev == 0 {
				runtime.SetMutexProfileFraction(0)
			}
		}
	}
	if p.blockUsers == 0 {
		runtime.SetBlockProfileRate(cmp.Or(rate, defaultBlockRate))
	}
	p.blockUsers++
	p.blockEver = true
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.blockUsers--; p.blockUsers == 0 {
			runtime.SetBlockProfileRate(0)
		}
	}
}

// profileError answers in plain text, which go tool pprof prints.
func profileError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Go-Pprof", "1")
	w.WriteHeader(status)
	fmt.Fprintln(w, msg)
}
