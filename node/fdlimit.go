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
// handshakes an eighth, the logged-in connections the rest. It reports
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
	l.MaxHandshakes = min(l.MaxHandshakes, max(8, budget/8))
	l.MaxHandshakesPerAddr = min(l.MaxHandshakesPerAddr, l.MaxHandshakes)
	l.MaxConns = min(l.MaxConns, max(1, budget-l.MaxHandshakes))
	return l, true
}

// applyFDLimit fits cfg's caps to the process's descriptor limit and
// logs the figures.
func applyFDLimit(cfg *Config) {
	soft, hard, ok := fdLimit()
	if !ok {
		return
	}
	l, lowered := fitFDs(soft, cfg.Limits, cfg.HTTP != "")
	attrs := []any{"limit", soft, "hard_limit", hard, "reserve", fdReserve(soft),
		"max_connections", l.MaxConns, "max_handshakes", l.MaxHandshakes}
	if cfg.HTTP != "" {
		attrs = append(attrs, "max_http_connections", l.MaxHTTPConns)
	}
	if lowered {
		cfg.Log.Warn("file descriptor limit too low for the configured connection limits: lowered them to fit; raise the limit (ulimit -n, LimitNOFILE=) to keep them", attrs...)
	} else {
		cfg.Log.Info("file descriptors", attrs...)
	}
	cfg.Limits = l
}
