package replica

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by a closed [Host] or [Group].
	ErrClosed = errors.New("replica: closed")
	// ErrLeadershipLost means this replica stopped being the leader while
	// a proposal of it was pending: its outcome is unknown (it may yet be
	// committed by the new leader). Retry with deduplication.
	ErrLeadershipLost = errors.New("replica: leadership lost, outcome unknown")
	// ErrDropped means Raft dropped the proposal (a leadership transfer
	// is in progress, or too much is uncommitted); it was not committed.
	ErrDropped = errors.New("replica: proposal dropped")
	// ErrConfChangePending means a membership change is still being
	// applied; change membership one replica at a time.
	ErrConfChangePending = errors.New("replica: membership change in progress")
	// ErrGroupExists is returned by [Host.Group] for a group already open.
	ErrGroupExists = errors.New("replica: group already open")
	// ErrCorrupt is wrapped by errors decoding a record or message.
	ErrCorrupt = errors.New("replica: corrupt record")
	// ErrFailed means the host's store failed: nothing more is persisted,
	// so the host stops every group.
	ErrFailed = errors.New("replica: store failed")
	// ErrTooLarge is returned for a proposal larger than the host's
	// maximum entry size.
	ErrTooLarge = errors.New("replica: proposal too large")
)

// NotLeaderError is returned by proposals and membership changes made on
// a replica that is not the group's leader. Leader is the replica id of
// the leader this replica knows of, 0 if none.
type NotLeaderError struct {
	Leader uint64
}

func (e *NotLeaderError) Error() string {
	if e.Leader == 0 {
		return "replica: not the leader (no leader known)"
	}
	return fmt.Sprintf("replica: not the leader (leader is %d)", e.Leader)
}

// ErrNotLeader matches every [*NotLeaderError] with errors.Is.
var ErrNotLeader = errors.New("replica: not the leader")

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }
