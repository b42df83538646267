package clustertest

import "errors"

// ErrNotRunning is returned for an operation on a node that does not run.
var ErrNotRunning = errors.New("clustertest: node not running")

// ErrNoNetem is returned by [Cluster.Netem] in netns mode when the
// kernel has no netem qdisc or tc is missing.
var ErrNoNetem = errors.New("clustertest: tc netem unavailable")

// ErrNoMetaLeader is returned when no node names a metadata leader.
var ErrNoMetaLeader = errors.New("clustertest: no metadata leader known")

// ErrNoQueueLeader is returned when no node serves a replicated queue.
var ErrNoQueueLeader = errors.New("clustertest: no queue leader known")
