package meta

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/wire"
)

// The forwarding protocol: a follower sends writes, linearizable reads,
// removals and status questions to the leader over a stream of its own.
// Each message is one frame:
//
//	version (1 byte, protoVersion) | type (1 byte) | length (4 bytes, big
//	endian) | JSON body (length bytes, at most maxFrame)
//
// A connection carries one request at a time, each answered by one
// response frame; or, when the requests carry an ID (writes and read
// indexes, pipe.go), many at once, each answer carrying its request's
// ID, in any order. A frame of another version is answered with an error
// frame of this version and the connection is closed; so is a frame too
// large or not valid JSON. Requests carry their remaining time, not a
// wall-clock deadline, so clock differences between nodes do not matter.
const (
	protoVersion = 1
	frameHeader  = 6
	// maxFrame bounds a frame's body: commands are small (an exchange
	// configuration with its expressions, a user with its hash).
	maxFrame = 1 << 20
)

// Frame types.
const (
	typeApply  byte = 1 // body: request{Command}; answer: response{Index, Result}
	typeRead   byte = 2 // body: request{}; answer: response{Index} (the read index)
	typeStatus byte = 3 // body: request{Node: the asker}; answer: response{Status}
	typeRemove byte = 4 // body: request{Node}; answer: response{Index}
	typeBeat   byte = 5 // body: request{Node: the sender, Config, Marks}; answer: response{Beat}
	typeMark   byte = 6 // body: request{Node: the sender, Config}; answer: response{Mark}
	typeFence  byte = 7 // body: request{Term}; answer: response{Fence}
	typeOK     byte = 0x80
	typeError  byte = 0x81
)

// Bounds on the server side of a connection.
const (
	// idleTimeout closes a forwarding connection without requests.
	idleTimeout = 2 * time.Minute
	// ioTimeout bounds reading a frame once its header came, and
	// writing one.
	ioTimeout = 10 * time.Second
	// maxRequestTime caps the time a forwarded request may ask for.
	maxRequestTime = 30 * time.Second
	// maxServerConns bounds the forwarding connections a node serves.
	maxServerConns = 256
)

type request struct {
	// ID numbers a request on a pipelined connection (pipe.go): the
	// leader may answer it before the ones sent earlier, with the same
	// ID. 0: one request at a time, answered in order.
	ID uint64 `json:"id,omitempty"`
	// TimeoutMS is the time left to the sender, in milliseconds.
	TimeoutMS int64    `json:"timeout_ms"`
	Command   *command `json:"command,omitempty"`
	Node      string   `json:"node,omitempty"`
	// Config is, in a heartbeat or mark, the configuration index of
	// the last leader answer the sender had.
	Config uint64 `json:"config,omitempty"`
	// Marks is set on a heartbeat whose sender also marks it on every
	// voter (see markVoters); a leader refuses a heartbeat without.
	Marks bool `json:"marks,omitempty"`
	// Term is the term of a fencing round.
	Term uint64 `json:"term,omitempty"`
}

type response struct {
	// ID is the request's ID (pipelined requests only).
	ID     uint64      `json:"id,omitempty"`
	Index  uint64      `json:"index,omitempty"`
	Result *result     `json:"result,omitempty"`
	Status *Status     `json:"status,omitempty"`
	Beat   *beatReply  `json:"beat,omitempty"`
	Mark   *markReply  `json:"mark,omitempty"`
	Fence  *fenceReply `json:"fence,omitempty"`
	Err    *errInfo    `json:"error,omitempty"`
}

// Status is what a node says of itself to a peer deciding whether to
// bootstrap.
type Status struct {
	Node string `json:"node"`
	// HasState is set when the node has Raft state: it belongs to a
	// formed cluster, or did.
	HasState bool `json:"has_state"`
	// Leader is the leader it knows, if any.
	Leader string `json:"leader,omitempty"`
	// Removed is set when the node that asked was removed from the
	// group (it is in State.Removed).
	Removed bool `json:"removed,omitempty"`
}

// errInfo is an error on the wire: a wire code, or a known sentinel's
// name, and the message.
type errInfo struct {
	Code wire.Code `json:"code,omitempty"`
	Kind string    `json:"kind,omitempty"`
	Msg  string    `json:"msg"`
}

// sentinels are the errors a forwarded request may end with that the
// sender tests with errors.Is.
var sentinels = map[string]error{
	"no-quorum": ErrNoQuorum, "not-leader": ErrNotLeader, "stale": ErrStale, "removed": ErrRemoved, "unknown-node": ErrUnknownNode,
	"bad-command": ErrBadCommand, "bad-frame": ErrBadFrame, "closed": ErrClosed, "session-expired": ErrSessionExpired,
	"no-user": auth.ErrNoUser, "user-exists": auth.ErrUserExists, "bad-name": auth.ErrBadName,
	"bad-password": auth.ErrBadPassword, "bad-hash": auth.ErrBadHash, "bad-tag": auth.ErrBadTag,
	"bad-pattern": auth.ErrBadPattern, "last-admin": auth.ErrLastAdmin, "no-users": auth.ErrNoUsers,
}

func encodeError(err error) *errInfo {
	if err == nil {
		return nil
	}
	var we *wire.Error
	if errors.As(err, &we) {
		return &errInfo{Code: we.Code, Msg: we.Msg}
	}
	for kind, s := range sentinels {
		if errors.Is(err, s) {
			return &errInfo{Kind: kind, Msg: err.Error()}
		}
	}
	return &errInfo{Msg: err.Error()}
}

// remoteError is a sentinel error that came over the wire: its message
// as the leader wrote it, and errors.Is finds the sentinel.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

func (e *errInfo) err() error {
	if e == nil {
		return nil
	}
	if e.Code != 0 {
		return &wire.Error{Code: e.Code, Msg: e.Msg}
	}
	if s, ok := sentinels[e.Kind]; ok {
		return &remoteError{msg: e.Msg, is: s}
	}
	return errors.New(e.Msg)
}

// writeFrame writes one frame.
func writeFrame(w io.Writer, typ byte, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	if len(b) > maxFrame {
		return fmt.Errorf("%w: %d bytes to send", ErrBadFrame, len(b))
	}
	buf := make([]byte, frameHeader, frameHeader+len(b))
	buf[0], buf[1] = protoVersion, typ
	binary.BigEndian.PutUint32(buf[2:], uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readFrame reads one frame's header and body into body. before is
// called once the header arrived (to move the read deadline).
func readFrame(r io.Reader, body any, before func()) (byte, error) {
	var h [frameHeader]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, err
	}
	if before != nil {
		before()
	}
	if h[0] != protoVersion {
		return h[1], fmt.Errorf("%w: version %d, this node speaks %d", ErrBadFrame, h[0], protoVersion)
	}
	n := binary.BigEndian.Uint32(h[2:])
	if n > maxFrame {
		return h[1], fmt.Errorf("%w: %d bytes, at most %d", ErrBadFrame, n, maxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return h[1], err
	}
	if err := json.Unmarshal(b, body); err != nil {
		return h[1], fmt.Errorf("%w: %v", ErrBadFrame, err)
	}
	return h[1], nil
}

// ForwardLayer carries the forwarding protocol between nodes: the
// node's listener, and a dialer to another node's. The fabric provides
// authenticated streams; tests use plain TCP.
type ForwardLayer interface {
	net.Listener
	// Dial opens a stream to the forwarding listener of the node id,
	// whose Raft address is addr, before ctx ends.
	Dial(ctx context.Context, id, addr string) (net.Conn, error)
}

// PeerIdentity is implemented by forwarding connections that know which
// node is at the other end (the fabric's authenticated streams). The
// leader then takes from that peer only renewals of its own record and
// declarations homed on itself.
type PeerIdentity interface {
	PeerNode() string
}

// serveForward accepts forwarding connections until the listener closes.
func (m *Meta) serveForward() {
	defer m.wg.Done()
	sem := make(chan struct{}, maxServerConns)
	for {
		c, err := m.cfg.Forward.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			m.log.Warn("meta: forward accept", "error", err)
			select {
			case <-time.After(50 * time.Millisecond):
			case <-m.done:
				return
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			m.log.Warn("meta: too many forwarding connections", "max", maxServerConns, "peer", c.RemoteAddr())
			c.Close()
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			defer func() { <-sem }()
			m.serveConn(c)
		}()
	}
}

// serveConn answers the requests of one connection: one at a time, in
// order, or, for requests with an ID (a pipelined connection, pipe.go),
// up to maxPipelined at once, each answered when it is done.
func (m *Meta) serveConn(c net.Conn) {
	m.trackConn(c, true)
	defer m.trackConn(c, false)
	defer c.Close()
	r := bufio.NewReader(c)
	peer := ""
	if p, ok := c.(PeerIdentity); ok {
		peer = p.PeerNode()
	}
	var wmu sync.Mutex // one answer written at a time
	answer := func(id uint64, resp response) error {
		resp.ID = id
		out := typeOK
		if resp.Err != nil {
			out = typeError
		}
		wmu.Lock()
		defer wmu.Unlock()
		c.SetWriteDeadline(time.Now().Add(ioTimeout))
		return writeFrame(c, out, resp)
	}
	slots := make(chan struct{}, maxPipelined)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c.SetReadDeadline(time.Now().Add(idleTimeout))
		var req request
		typ, err := readFrame(r, &req, func() { c.SetReadDeadline(time.Now().Add(ioTimeout)) })
		if err != nil {
			if errors.Is(err, ErrBadFrame) {
				answer(0, response{Err: encodeError(err)})
			}
			return
		}
		if req.ID == 0 || typ != typeApply && typ != typeRead {
			if err := answer(req.ID, m.handle(typ, &req, peer)); err != nil {
				return
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-m.done:
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			if err := answer(req.ID, m.handle(typ, &req, peer)); err != nil {
				c.Close()
			}
		}()
	}
}

// handle answers one forwarded request from peer ("" if unknown).
func (m *Meta) handle(typ byte, req *request, peer string) response {
	d := time.Duration(req.TimeoutMS) * time.Millisecond
	if d <= 0 {
		return response{Err: encodeError(fmt.Errorf("%w: no time left", ErrNoQuorum))}
	}
	ctx, cancel := context.WithTimeout(m.ctx, min(d, maxRequestTime))
	defer cancel()
	switch typ {
	case typeApply:
		if req.Command == nil || !forwardable[req.Command.Op] {
			return response{Err: encodeError(fmt.Errorf("%w: not a command a peer may send", ErrBadFrame))}
		}
		if req.Command.V < 1 || req.Command.V > cmdVersion {
			return response{Err: encodeError(fmt.Errorf("%w: command version %d, this node applies %d", ErrBadCommand, req.Command.V, cmdVersion))}
		}
		if c := req.Command; peer != "" && (c.Op == opRenew && c.Name != peer || (c.Op == opDeclare || c.Op == opQueueLeader || c.Op == opQueueMemberDone) && c.Home != peer) {
			return response{Err: encodeError(fmt.Errorf("%w: node %q may not %s for %q", ErrBadFrame, peer, c.Op, c.Name+c.Home))}
		}
		if c := req.Command; peer != "" && c.Session != "" && !strings.HasPrefix(c.Session, peer+"/") {
			return response{Err: encodeError(fmt.Errorf("%w: node %q may not use session %q", ErrBadFrame, peer, c.Session))}
		}
		idx, res, err := m.applyLeader(ctx, req.Command)
		if err != nil {
			return response{Err: encodeError(err)}
		}
		m.askNudge()
		return response{Index: idx, Result: res, Err: encodeError(res.Err)}
	case typeRead:
		idx, err := m.readIndexLeader(ctx)
		return response{Index: idx, Err: encodeError(err)}
	case typeStatus:
		st := m.status()
		if req.Node != "" {
			m.fsm.read(func(s *State) { _, st.Removed = s.Removed[req.Node] })
		}
		return response{Status: &st}
	case typeRemove:
		idx, err := m.removeLeader(ctx, req.Node)
		return response{Index: idx, Err: encodeError(err)}
	case typeBeat:
		if req.Node == "" || peer != "" && req.Node != peer {
			return response{Err: encodeError(fmt.Errorf("%w: node %q may not send a heartbeat for %q", ErrBadFrame, peer, req.Node))}
		}
		if !req.Marks {
			// A node of an older version, which trusts this answer
			// alone: it falls back to renewals through the log.
			return response{Err: encodeError(fmt.Errorf("%w: heartbeat without marks", ErrBadFrame))}
		}
		b, err := m.beatLeader(ctx, req.Node, req.Config)
		if err != nil {
			return response{Err: encodeError(err)}
		}
		return response{Beat: &b}
	case typeMark:
		if req.Node == "" || peer != "" && req.Node != peer {
			return response{Err: encodeError(fmt.Errorf("%w: node %q may not mark a heartbeat for %q", ErrBadFrame, peer, req.Node))}
		}
		r := m.mark(req.Node, req.Config)
		return response{Mark: &r}
	case typeFence:
		f, err := m.answerFence(req.Term, peer)
		if err != nil {
			return response{Err: encodeError(err)}
		}
		return response{Fence: &f}
	}
	return response{Err: encodeError(fmt.Errorf("%w: unknown type %d", ErrBadFrame, typ))}
}
