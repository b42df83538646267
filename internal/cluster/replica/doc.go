// Package replica runs many Raft groups on one node: the foundation of
// Courier's replicated durable queues (issue 15, docs/replication.md).
//
// A [Host] drives every group of its node with go.etcd.io/raft/v3
// RawNodes: one driver goroutine ticks all groups, steps the messages
// that arrive, collects each group's Ready, persists the entries and
// hard states of all of them in one round of appends to the host's
// [store.Log] (one group commit, one fsync for the whole round), then
// sends the round's messages, batched per peer host, through a
// [Transport], and hands committed entries to each group's apply
// goroutine, which calls its [StateMachine] in log order. PreVote and
// CheckQuorum are on.
//
// A [Group] is the handle of one group on one host: [Group.Propose]
// returns once the entry is committed on a majority and applied
// locally; [Group.Status], [Group.TransferLeadership], and one-replica
// membership changes ([Group.AddVoter], [Group.AddLearner],
// [Group.RemoveReplica]) complete the API.
//
// # On disk
//
// The host's log holds its groups' records, each tagged with the group
// (layout in record.go): [KindReady], a group's new hard state and log
// entries from one Ready; [KindSnap], a snapshot that replaced a
// group's log; [KindCompact], a snapshot a group took of its state
// machine; [KindSnapPart], a piece of a snapshot too large for one
// record. A group's snapshot is its checkpoint (compact.go): once a
// snapshot is durable, the records it made useless are released from
// the store, and the host checkpoints the store with the list of the
// records still live, so that a restart reads those and replays the
// tail after the checkpoint. A host whose store reports corrupt or
// missing data, or a group whose recovered log ends before its own
// recorded commit index, marks the group damaged: the replica keeps
// receiving the log but never campaigns and never grants a vote, so it
// cannot help elect a leader on a log it lost.
//
// # Quiescence
//
// An idle group stops ticking on every replica (quiesce.go); the hosts
// heartbeat each other instead, one message per peer host per interval,
// and wake the quiet groups a dead or restarted peer concerns.
package replica
