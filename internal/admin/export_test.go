package admin

import "time"

// Bridge to internals for the tests of package admin_test.

// WithClock makes the server read time from now.
func WithClock(c *Config, now func() time.Time) { c.now = now }

// Sample runs one sample at the clock's time, as the sampler goroutine
// does every interval.
func (s *Server) Sample() { s.smp.sample(s.cfg.now()) }

// ListPages is the paging limit of lists.
const MaxPageSize = maxPageSize
