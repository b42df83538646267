package node

// File descriptors. Every client connection, connection in its handshake
// and management connection takes one, and so do the store's files; a
// process out of them cannot accept (accept4: too many open files). At
// start the node reads its limit (RLIMIT_NOFILE; the Go runtime has
// already raised the soft limit to the hard one) and, when the
// configured caps do not fit in it, lowers them so that they do, keeping
// a reserve for the node's own files.

// fdReserve is the descriptors kept for the node's own files (store
// segments, users file, listeners, logs) out of a limit: a tenth of it,
// at least 64.
func fdReserve(limit uint64) uint64 { return max(64, limit/10) }

// fitFDs returns l with its connection caps lowered, if needed, so that
// they fit in limit descriptors with the reserve: the management
// listener (when http) gets at most a sixteenth of what is left, the
// handshakes an eighth (one address a sixteenth of those), the
// logged-in connections the rest. It reports
// whether it lowered any.
func fitFDs(limit uint64, l Limits, http bool) (Limits, bool) {
	if limit < 2*fdReserve(limit) {
		limit = 2 * fdReserve(limit) // too low to share: give each a little
	}
	budget := int(min(limit-fdReserve(limit), 1<<40))
	need := l.MaxConns + l.MaxHandshakes
	if http {
		need += l.MaxHTTPConns
	}
	if need <= budget {
		return l, false
	}
	if http {
		l.MaxHTTPConns = min(l.MaxHTTPConns, max(4, budget/16))
		budget -= l.MaxHTTPConns
	}
	if h := max(8, budget/8); h < l.MaxHandshakes {
		// One address keeps at most its default share, a sixteenth, so
		// that it alone cannot take every handshake of a lowered cap.
		l.MaxHandshakes = h
		l.MaxHandshakesPerAddr = min(l.MaxHandshakesPerAddr, max(1, h/16))
	}
	l.MaxConns = min(l.MaxConns, max(1, budget-l.MaxHandshakes))
	return l, true
}

// fewConns is the cap on logged-in connections under which a lowered
// cap is worth a warning rather than a line of information.
const fewConns = 1024

// applyFDLimit fits cfg's caps to the process's descriptor limit and
// returns a function that logs the figures, called once the node is up
// (an error of Start is then the only thing it prints).
func applyFDLimit(cfg *Config) (logFigures func()) {
	soft, hard, ok := fdLimit()
	if !ok {
		return func() {}
	}
	l, lowered := fitFDs(soft, cfg.Limits, cfg.HTTP != "")
	cfg.Limits = l
	attrs := []any{"limit", soft, "hard_limit", hard, "reserve", fdReserve(soft),
		"max_connections", l.MaxConns, "max_handshakes", l.MaxHandshakes}
	if cfg.HTTP != "" {
		attrs = append(attrs, "max_http_connections", l.MaxHTTPConns)
	}
	log := cfg.Log
	return func() {
		switch {
		case lowered && l.MaxConns < fewConns:
			log.Warn("file descriptor limit too low for the configured connection limits: lowered them to fit; raise the limit (ulimit -n, LimitNOFILE=)", attrs...)
		case lowered:
			log.Info("file descriptors: connection limits lowered to fit the limit", attrs...)
		default:
			log.Info("file descriptors", attrs...)
		}
	}
}
