package meta

import "errors"

// Errors of the metadata group. Each is wrapped with detail; test with
// errors.Is. Errors of the state machine itself (a clash, an unknown
// exchange) are *wire.Error values with their stable codes, or the
// sentinels of internal/auth for users.
var (
	// ErrNoQuorum is a write or a linearizable read that could not be
	// done because no leader with a quorum answered before the deadline.
	// A write that fails with it after it was sent may still be applied
	// later: its outcome is unknown, as with any consensus system.
	ErrNoQuorum = errors.New("meta: no quorum")
	// ErrBehind is a write the group applied that this node had not yet
	// applied when the deadline came: other nodes see it, this one will.
	ErrBehind = errors.New("meta: applied by the group, not yet on this node")
	// ErrClosed is a call on a Meta that was shut down.
	ErrClosed = errors.New("meta: shut down")
	// ErrBadFrame is a forwarding frame that cannot be read: too large,
	// of an unknown version or type, or not valid JSON.
	ErrBadFrame = errors.New("meta: bad forwarding frame")
	// ErrNotLeader is a forwarded request that reached a node that is not
	// the leader (any longer); the sender retries with the new leader.
	ErrNotLeader = errors.New("meta: not the leader")
	// ErrStale is a liveness command that no longer applies: the record
	// moved on since the leader looked at it.
	ErrStale = errors.New("meta: stale liveness command")
	// ErrRemoved is a renewal from a node removed with Remove: the node
	// stops its member of the group when it gets it.
	ErrRemoved = errors.New("meta: this node was removed from the cluster")
	// ErrUnknownNode is a node the group does not know.
	ErrUnknownNode = errors.New("meta: unknown node")
	// ErrBadCommand is a command the state machine cannot read.
	ErrBadCommand = errors.New("meta: bad command")
	// ErrSessionExpired is a command of a client session the group no
	// longer holds, or whose result it dropped: it was not applied (again).
	// The node opens a new session; the command's outcome, if it was a
	// retry, is unknown.
	ErrSessionExpired = errors.New("meta: client session expired")
)
