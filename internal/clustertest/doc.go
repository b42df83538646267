// Package clustertest is Courier's fault-test harness: it runs real
// `courier server` processes, injects faults into them (nemeses), records
// what clients saw into a [History], and judges the history with checkers.
//
// The shape is Jepsen's: clients record every operation with the times
// of its call and its outcome, a nemesis records every fault with the
// times it began and ended, and checkers read the history afterwards.
// All times are nanoseconds of one monotonic clock, the test process's,
// counted from the start of the history, so intervals recorded by
// different clients compare.
//
// A [Cluster] runs each node in its own network namespace when the
// process is root and has `ip` (mode [ModeNetns]): a switch namespace
// holds a bridge, every node namespace is linked to it by a veth pair,
// and the test's clients reach a node by dialing from a thread that has
// entered a namespace ([Cluster.DialContext]). Nodes have loopback
// addresses (127.77.0.N), so a dial that strays into the root namespace
// stays on the machine. Partitions are blackhole routes inside the node
// namespaces, delay and loss are `tc netem` on a node's veth (or, on a
// kernel without netem, a [Proxy] in the node's namespace in front of
// its cluster port); nothing in the root namespace's network is
// touched.
// Elsewhere (mode [ModeProxy]) nodes listen on 127.0.0.1 and a fault
// proxy of this package ([Proxy]) stands in front of every node's
// cluster port, so the same scenarios run with cuts, delays and drops
// made by the proxy instead of by the kernel.
//
// Checkers, each a pure function of a history:
//
//   - [CheckRegistry]: exchange declare/delete/get are linearizable
//     (porcupine, with a model of the exchange registry);
//   - [CheckLeaders]: leader intervals of one exchange never overlap and
//     fencing tokens strictly increase;
//   - [CheckPubSub]: per-publisher order, no duplicates, losses only
//     inside fault windows;
//   - [CheckRequests]: every request has exactly one outcome by its
//     deadline plus a margin;
//   - [CheckTasks]: every confirmed task is delivered at least once;
//   - [CheckKeyedTasks]: per key, tasks confirmed one after the other
//     are delivered in that order, and never two in flight at once;
//   - [CheckAttempts]: a task in flight on a node that died comes back
//     without a failed attempt;
//   - [CheckMinority]: a node cut off from the majority confirms
//     nothing.
//
// The queue nemeses ([KillQueueLeader], [PauseQueueLeader],
// [IsolateQueueLeader]) aim at the node that serves a replicated queue.
//
// docs/cluster.md "Fault tests" tells how to run short and long runs.
package clustertest
