package meta

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
)

// Client sessions make catalog commands exactly-once (Ongaro's
// dissertation, §6.3). Each node opens a session of its own in the log
// (opOpenSession, session id "node/random"), numbers its catalog
// commands in it (Seq, from 1), and says with each command which ones it
// will never send again (Done: every Seq below it has an outcome at the
// node). The state machine keeps, per session, the result of every
// command at or above Done; a command applied a second time (a retry of
// one whose outcome was unknown, across a leader change) gets the stored
// result and changes nothing. So the node retries a command whose
// outcome is unknown until it has the true one, or its deadline ends.
//
// The table is bounded and expires deterministically, by log index
// alone: a session opened pushes out the sessions idle for more than
// sessionIdleEntries entries, then, beyond maxSessions, the least
// recently used ones (ties by id); a session keeps at most
// maxSessionResults results (the lowest sequence goes first). A command
// of a session the table no longer holds, or whose result it dropped,
// is refused with ErrSessionExpired, never applied again.
const (
	// maxSessions bounds the sessions the state machine keeps: a node
	// opens one each time it starts.
	maxSessions = 1024
	// sessionIdleEntries expires a session without a command in that
	// many log entries.
	sessionIdleEntries = 1 << 20
	// maxSessionResults bounds the results one session keeps; a node
	// keeps fewer commands than this in flight (maxInFlight).
	maxSessionResults = 4096
	// maxInFlight bounds the catalog commands a node has in flight at
	// once; more wait for a slot.
	maxInFlight = 1024
)

// catalogOps are the operations made in a client session.
var catalogOps = map[string]bool{opDeclare: true, opDelete: true, opPutUser: true, opDeleteUser: true,
	opSetPerms: true, opClearPerms: true, opQueueMove: true, opQueueMember: true}

// session is one client session in the state machine.
type session struct {
	// Last is the log index of its last command.
	Last uint64 `json:"last"`
	// Done: every sequence below it has an outcome at its node.
	Done uint64 `json:"done"`
	// Results are the results of its commands at or above Done, by
	// sequence.
	Results map[uint64]storedResult `json:"results,omitempty"`
}

// storedResult is a command's result as the session table keeps it,
// and as a snapshot holds it.
type storedResult struct {
	Exchange *Exchange `json:"exchange,omitempty"`
	Created  bool      `json:"created,omitempty"`
	Err      *errInfo  `json:"error,omitempty"`
}

func keep(r result) storedResult {
	return storedResult{Exchange: r.Exchange, Created: r.Created, Err: encodeError(r.Err)}
}

func (s storedResult) result() result {
	return result{Exchange: s.Exchange, Created: s.Created, Err: s.Err.err()}
}

// sessions is the session table; the fsm's mu guards it.
type sessions map[string]*session

// open creates session id at index if it does not exist, after expiring
// the idle ones and, beyond maxSessions, the least recently used.
func (t sessions) open(id string, index uint64) {
	if s, ok := t[id]; ok {
		s.Last = max(s.Last, index)
		return
	}
	for sid, s := range t {
		if index-min(s.Last, index) > sessionIdleEntries {
			delete(t, sid)
		}
	}
	if len(t) >= maxSessions {
		ids := slices.SortedFunc(maps.Keys(t), func(a, b string) int {
			return cmp.Or(cmp.Compare(t[a].Last, t[b].Last), cmp.Compare(a, b))
		})
		for _, sid := range ids[:len(t)-maxSessions+1] {
			delete(t, sid)
		}
	}
	t[id] = &session{Last: index, Results: map[uint64]storedResult{}}
}

// lookup returns the stored result of c in its session, if it was
// applied before, or the error that refuses it; ok is false when c is
// to be applied. It records c's Done and index.
func (t sessions) lookup(index uint64, c *command) (res result, ok bool) {
	s, found := t[c.Session]
	if !found {
		return result{Err: fmt.Errorf("%w: %q is not open", ErrSessionExpired, c.Session)}, true
	}
	s.Last = max(s.Last, index)
	if c.Done > s.Done {
		s.Done = c.Done
		for seq := range s.Results {
			if seq < s.Done {
				delete(s.Results, seq)
			}
		}
	}
	if r, dup := s.Results[c.Seq]; dup {
		return r.result(), true
	}
	if c.Seq == 0 || c.Seq < s.Done {
		return result{Err: fmt.Errorf("%w: %q no longer holds the result of %d", ErrSessionExpired, c.Session, c.Seq)}, true
	}
	return result{}, false
}

// record stores the result of c, applied for the first time.
func (t sessions) record(c *command, res result) {
	s := t[c.Session]
	if s == nil {
		return
	}
	if len(s.Results) >= maxSessionResults {
		delete(s.Results, slices.Min(slices.Collect(maps.Keys(s.Results))))
	}
	s.Results[c.Seq] = keep(res)
}

// clone returns a deep copy, for a snapshot.
func (t sessions) clone() sessions {
	out := make(sessions, len(t))
	for id, s := range t {
		if s == nil {
			continue
		}
		c := *s
		c.Results = maps.Clone(s.Results)
		if c.Results == nil {
			c.Results = map[uint64]storedResult{}
		}
		out[id] = &c
	}
	return out
}

// clientSession is a node's side of its session: the id, the next
// sequence, and the sequences in flight (for Done).
type clientSession struct {
	mu       sync.Mutex
	id       string
	opened   bool
	next     uint64
	inFlight map[uint64]bool
	// opening serializes opening: one opens, the others wait for it
	// (a channel of one, so that they wait within their context).
	opening chan struct{}
}

// newSessionID returns "node/16 hex digits".
func newSessionID(node string) string {
	var b [8]byte
	rand.Read(b[:])
	return node + "/" + hex.EncodeToString(b[:])
}

// begin numbers c in the session: its Seq, and the Done it carries.
func (s *clientSession) begin(c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	c.Session, c.Seq = s.id, s.next
	s.inFlight[c.Seq] = true
	c.Done = s.doneLocked()
}

// refresh updates the Done c carries before another attempt.
func (s *clientSession) refresh(c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Session == s.id {
		c.Done = s.doneLocked()
	}
}

// end records that c has its outcome: it is never sent again.
func (s *clientSession) end(c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Session == s.id {
		delete(s.inFlight, c.Seq)
	}
}

// doneLocked is the lowest sequence in flight, or the next one.
func (s *clientSession) doneLocked() uint64 {
	done := s.next + 1
	for seq := range s.inFlight {
		done = min(done, seq)
	}
	return done
}

// expired replaces a session the group no longer holds with a new one,
// to be opened before the next command; id is the one that expired.
func (s *clientSession) expired(id, node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opening == nil {
		s.opening = make(chan struct{}, 1)
	}
	if s.id == id {
		s.id, s.opened, s.next, s.inFlight = newSessionID(node), false, 0, map[uint64]bool{}
	}
}

func (s *clientSession) state() (id string, opened bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, s.opened
}

func (s *clientSession) setOpened(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.id == id {
		s.opened = true
	}
}
