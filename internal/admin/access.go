package admin

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/broker"
)

// Access to the management listener, once the node has users: every
// request needs HTTP Basic credentials, and the user's tags decide what
// it may do. Without users (a loopback listener only) everything is open.
//
//	path                          administrator  monitoring   other users
//	/api/whoami                   yes            yes          yes
//	/metrics                      yes            yes          yes (open to all unless MetricsAuth)
//	/api/users, /api/permissions  yes            no           no
//	/api/definitions              yes            no           no
//	/debug/pprof/                 yes            no           no
//	anything else, GET and HEAD   yes            yes          no
//	anything else, other methods  yes            no           no
//
// /metrics/per-object falls under "anything else": it names every
// exchange and queue, which the node-wide /metrics does not.
//
// Every response, refusals included, carries the headers of
// setSecurityHeaders.

// realm is the HTTP Basic realm browsers show in their login prompt.
const realm = `Basic realm="Courier", charset="UTF-8"`

// contentSecurityPolicy lets pages of the management listener load
// scripts, styles and data from the listener itself only: the
// dashboard has no inline script or style (its favicon is a data: URL),
// so an injected one does not run. No page may frame it.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// setSecurityHeaders sets the headers that keep browsers from running
// injected content, sniffing types or framing the listener's pages.
func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// guard wraps h with the security headers, authentication and the
// access rules above.
func (s *Server) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setSecurityHeaders(w.Header())
		users := s.cfg.Users
		if users == nil || !users.HasUsers() {
			h.ServeHTTP(w, r)
			return
		}
		metrics := r.URL.Path == "/metrics"
		if metrics && !s.cfg.MetricsAuth {
			h.ServeHTTP(w, r)
			return
		}
		name, pass, ok := r.BasicAuth()
		if !ok {
			endAfter(w)
			w.Header().Set("WWW-Authenticate", realm)
			writeError(w, &apiError{http.StatusUnauthorized, "unauthorized", "credentials required: this node has users; use HTTP Basic authentication"})
			return
		}
		// A failure is logged by the store, a line per source per 10 s.
		user, err := users.Login(r.Context(), auth.Attempt{User: name, Password: pass, Peer: r.RemoteAddr, Via: "management"})
		if err != nil {
			endAfter(w)
		}
		if errors.Is(err, auth.ErrBusy) {
			w.Header().Set("Retry-After", "1")
			writeError(w, &apiError{http.StatusServiceUnavailable, "busy", "too many logins in progress; try again later"})
			return
		}
		if err != nil {
			w.Header().Set("WWW-Authenticate", realm)
			writeError(w, &apiError{http.StatusUnauthorized, "unauthorized", "bad user name or password"})
			return
		}
		if !mayAccess(users, user, r, metrics) {
			s.log.Warn("management API: access refused", "user", user, "method", r.Method, "path", r.URL.Path)
			writeError(w, &apiError{http.StatusForbidden, "access_refused",
				"user " + user + " may not " + r.Method + " " + r.URL.Path + ": it needs the administrator tag (or monitoring, to read)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// endAfter closes the connection of a request refused before it was
// authenticated once the answer is written, without reading the rest of
// its body: a client that is not logged in must not hold a place of the
// management listener by sending a body slowly.
func endAfter(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	http.NewResponseController(w).SetReadDeadline(time.Now())
}

// mayAccess applies the table above.
func mayAccess(users *auth.Store, user string, r *http.Request, metrics bool) bool {
	p := r.URL.Path
	if metrics || p == "/api/whoami" || users.HasTag(user, auth.TagAdministrator) {
		return true
	}
	if !users.HasTag(user, auth.TagMonitoring) {
		return false
	}
	read := r.Method == http.MethodGet || r.Method == http.MethodHead
	return read && !underAny(p, "/api/users", "/api/permissions", "/api/definitions", "/debug/pprof")
}

// declarer is who the request declares exchanges as: the user it
// authenticated as (guard checked it), or the anonymous user while the
// node has no users, with the node's permissions; trusted without a
// users store.
func (s *Server) declarer(r *http.Request) broker.Declarer {
	users := s.cfg.Users
	if users == nil {
		return broker.Trusted()
	}
	by := broker.Declarer{Policy: users}
	if users.HasUsers() {
		by.User, _, _ = r.BasicAuth()
	}
	return by
}

// underAny reports whether path is one of roots or below one.
func underAny(path string, roots ...string) bool {
	return slices.ContainsFunc(roots, func(root string) bool {
		return path == root || strings.HasPrefix(path, root+"/")
	})
}

// whoami answers who the request authenticated as:
// {"name": "alice", "tags": ["administrator"]}; {"name": "", "tags": [],
// "anonymous": true} while the node has no users.
func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	type me struct {
		Name      string   `json:"name"`
		Tags      []string `json:"tags"`
		Anonymous bool     `json:"anonymous,omitempty"`
	}
	users := s.cfg.Users
	if users == nil || !users.HasUsers() {
		writeJSON(w, http.StatusOK, me{Tags: []string{}, Anonymous: true})
		return
	}
	name, _, _ := r.BasicAuth() // guard checked it
	u, ok := users.User(name)
	if !ok {
		writeError(w, notFound("user %q not found", name))
		return
	}
	writeJSON(w, http.StatusOK, me{Name: u.Name, Tags: u.Tags})
}
