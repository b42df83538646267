package wire

// Control frames (handshake, declare, attach, events) are rare, so their
// structured parts travel as JSON in the frame body: easy to read in any
// language and free to grow. The hot frames (REQUEST, RESPONSE, PUBLISH,
// MESSAGE) never carry JSON.

// Hello is the JSON body of the client's HELLO frame.
type Hello struct {
	// Versions lists the protocol versions the client speaks.
	Versions []int `json:"versions"`
	// Name names the client in logs and the management API.
	Name string `json:"name,omitempty"`
	// HeartbeatMS is the heartbeat interval the client asks for; the
	// server may lower it. 0 asks for the server's default.
	HeartbeatMS int `json:"heartbeat_ms,omitempty"`
	// MaxFrame is the largest frame the client accepts; 0 for the default.
	MaxFrame int `json:"max_frame,omitempty"`
	// User and Password authenticate the client when the server has users.
	User     string `json:"user,omitempty"`
	Password string `json:"password,omitempty"`
}

// Welcome is the JSON body of the server's WELCOME frame.
type Welcome struct {
	Version     int    `json:"version"`
	Server      string `json:"server"`
	Node        string `json:"node"`
	Conn        string `json:"conn"`
	HeartbeatMS int    `json:"heartbeat_ms"`
	// TimeoutMS is how long either side waits without traffic before it
	// declares the connection dead.
	TimeoutMS int `json:"timeout_ms"`
	MaxFrame  int `json:"max_frame"`
	// Credit is the initial number of PUBLISH and REQUEST frames the client
	// may send; CREDIT frames add more.
	Credit uint64 `json:"credit"`
	// ConnectURLs are the client addresses (host:port) of the servers a
	// client may reconnect to: this server's own and, in a cluster, every
	// node's. Clients bound what they take from it (see client.Options).
	ConnectURLs []string `json:"connect_urls,omitempty"`
	// Dedup says the server deduplicates SUBMITs by the pid and seq task
	// options ([TaskOptions]); a client sends them only then, so that an
	// older server does not refuse them.
	Dedup bool `json:"dedup,omitempty"`
}

// Exchange patterns.
const (
	PatternReqResp = "reqresp"
	PatternPubSub  = "pubsub"
	PatternTasks   = "tasks"
)

// Task exchange strategies.
const (
	// StrategyCompeting: workers compete for tasks, round-robin (the
	// default).
	StrategyCompeting = "competing"
	// StrategySingleActive: one worker at a time takes tasks, the oldest;
	// the next takes over when it goes away, announced as its leader.
	StrategySingleActive = "single-active"
)

// ExchangeConfig is the JSON body of DECLARE.
type ExchangeConfig struct {
	Pattern    string `json:"pattern"`
	Strategy   string `json:"strategy,omitempty"`
	KeyExpr    string `json:"key_expr,omitempty"`
	RouteExpr  string `json:"route_expr,omitempty"`
	Controlled bool   `json:"controlled,omitempty"`
	// AMQPType, on a pub-sub exchange, is the AMQP exchange type it was
	// declared with through the AMQP listener: "direct", "fanout",
	// "topic" or "headers" (docs/amqp.md); empty for one declared
	// otherwise. It is kept with the exchange, in a cluster in its
	// replicated metadata, so that every node binds queues to it by its
	// type; declaring it again with another type clashes.
	AMQPType string `json:"amqp_type,omitempty"`

	// Transient makes the exchange live in memory only: its definition,
	// and a task exchange's queue with its tasks, are lost when the node
	// stops. By default every exchange is durable.
	Transient bool `json:"transient,omitempty"`

	// Task exchanges only. Zero values take the defaults.

	// MaxAttempts is how many times a task may fail before it is
	// dead-lettered: 0 takes the default (20), -1 means no limit.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// TTLMS bounds, in milliseconds, how long a task may wait once due.
	TTLMS int64 `json:"ttl_ms,omitempty"`
	// BackoffMS and BackoffMaxMS set the exponential backoff between
	// attempts: the first wait and its cap (defaults 100 ms and 30 s).
	BackoffMS    int64 `json:"backoff_ms,omitempty"`
	BackoffMaxMS int64 `json:"backoff_max_ms,omitempty"`
	// DeadLetter names the exchange that receives the tasks that fail
	// for good: a task exchange (they are submitted to it) or a pub-sub
	// exchange (they are published with their key). Empty drops them.
	DeadLetter string `json:"dead_letter,omitempty"`
	// MaxLength and MaxBytes bound the tasks a queue holds (ready,
	// delayed and unacked) and their body bytes; 0: no bound. Overflow
	// says what a submit to a full queue does: OverflowReject (the
	// default) refuses it with CodeQueueFull, OverflowDropHead
	// dead-letters the oldest ready task of the lowest priority to make
	// room.
	MaxLength int64  `json:"max_length,omitempty"`
	MaxBytes  int64  `json:"max_bytes,omitempty"`
	Overflow  string `json:"overflow,omitempty"`
	// DedupWindowMS is how long, in milliseconds, the queue remembers a
	// submit's pid and seq task options to store a resend once: 0 takes
	// the default (120,000: 2 minutes), -1 turns deduplication off.
	DedupWindowMS int64 `json:"dedup_window_ms,omitempty"`
	// Replicas is how many nodes of a cluster hold the task exchange's
	// queue, one Raft group over them (docs/queues.md, "Replicated
	// queues"): 0 takes the default (3 in a cluster of three or more
	// live nodes, else as many as there are), 1 keeps the queue on one
	// node. On a node alone only 0 and 1 are accepted. The cluster
	// records the number it chose, so a later declaration with 0 matches.
	Replicas int `json:"replicas,omitempty"`
}

// MaxReplicas is the largest Replicas of a task exchange.
const MaxReplicas = 7

// Overflow policies of a bounded task queue, as RabbitMQ names them.
const (
	OverflowReject   = "reject-publish"
	OverflowDropHead = "drop-head"
)

// ExchangeInfo describes an exchange in OK bodies of DECLARE and LIST.
type ExchangeInfo struct {
	Name        string   `json:"name"`
	Pattern     string   `json:"pattern"`
	Strategy    string   `json:"strategy,omitempty"`
	KeyExpr     string   `json:"key_expr,omitempty"`
	RouteExpr   string   `json:"route_expr,omitempty"`
	Controlled  bool     `json:"controlled,omitempty"`
	Leader      string   `json:"leader,omitempty"`
	Members     []Member `json:"members"`
	Subscribers int      `json:"subscribers"`
	Requests    uint64   `json:"requests"`
	Publishes   uint64   `json:"publishes"`

	Transient bool `json:"transient,omitempty"`

	// Task exchanges only.
	MaxAttempts   int        `json:"max_attempts,omitempty"`
	TTLMS         int64      `json:"ttl_ms,omitempty"`
	BackoffMS     int64      `json:"backoff_ms,omitempty"`
	BackoffMaxMS  int64      `json:"backoff_max_ms,omitempty"`
	DeadLetter    string     `json:"dead_letter,omitempty"`
	MaxLength     int64      `json:"max_length,omitempty"`
	MaxBytes      int64      `json:"max_bytes,omitempty"`
	Overflow      string     `json:"overflow,omitempty"`
	DedupWindowMS int64      `json:"dedup_window_ms,omitempty"`
	Replicas      int        `json:"replicas,omitempty"`
	Queue         *QueueInfo `json:"queue,omitempty"`
}

// QueueInfo is the live state of a queue: a task exchange's, or a
// durable subscription's.
type QueueInfo struct {
	Name         string `json:"name"`
	Durable      bool   `json:"durable"`
	Messages     int64  `json:"messages"`
	Ready        int64  `json:"messages_ready"`
	Unacked      int64  `json:"messages_unacknowledged"`
	Delayed      int64  `json:"messages_delayed"`
	Consumers    int64  `json:"consumers"`
	Bytes        int64  `json:"bytes"`
	Published    uint64 `json:"published"`
	Delivered    uint64 `json:"delivered"`
	Acked        uint64 `json:"acked"`
	DeadLettered uint64 `json:"dead_lettered"`
	// DeadLetterDropped counts the dead letters dropped instead of going
	// to the dead_letter exchange: it did not exist, or the exchange's
	// declarer no longer had write permission on it.
	DeadLetterDropped uint64 `json:"dead_letter_dropped"`
	// Deduplicated counts the resent submits answered from the
	// deduplication window instead of being stored again.
	Deduplicated uint64 `json:"deduplicated,omitempty"`
}

// Attachment roles, the Aux of ATTACH.
const (
	RoleHandler    = 1
	RoleSubscriber = 2
	RoleController = 3
	RoleWorker     = 4
)

// RoleName returns the name of an attachment role.
func RoleName(r uint64) string {
	switch r {
	case RoleHandler:
		return "handler"
	case RoleSubscriber:
		return "subscriber"
	case RoleController:
		return "controller"
	case RoleWorker:
		return "worker"
	}
	return "unknown"
}

// Member describes one attachment that takes part in an exchange's group.
type Member struct {
	ID         string            `json:"id"`
	Role       string            `json:"role"`
	ServiceTag string            `json:"service_tag,omitempty"`
	ConnTag    string            `json:"conn_tag,omitempty"`
	Options    map[string]string `json:"options,omitempty"`
	// Node is the node the member is attached to, in a cluster; empty on
	// a node alone.
	Node string `json:"node,omitempty"`
}

// AttachSpec is the JSON body of ATTACH.
type AttachSpec struct {
	Patterns []string `json:"patterns,omitempty"`
	// Prefetch is a worker's credit: how many tasks it may hold unsettled.
	// 0 takes the default (100). A durable subscriber has one too.
	Prefetch int `json:"prefetch,omitempty"`
	// Durable, on a pub-sub subscriber, names a durable subscription: a
	// queue bound to the patterns that keeps receiving while no one is
	// attached, and delivers its backlog as TASK frames to be acked.
	Durable string            `json:"durable,omitempty"`
	ConnTag string            `json:"conn_tag,omitempty"`
	Options map[string]string `json:"options,omitempty"`
}

// AttachResult is the JSON body of the OK answering ATTACH.
type AttachResult struct {
	Member   string   `json:"member"`
	Patterns []string `json:"patterns,omitempty"`
}

// Event kinds, the Aux of EVENT.
const (
	EventLeader        = 1 // Body: Leader, all Members, and the Member whose change caused it
	EventMemberUp      = 2 // Body: Member, Leader and all Members
	EventMemberDown    = 3 // Body: Member, Leader and all Members
	EventSubscriptions = 4 // Body: Patterns, the attachment's patterns now
	EventDetached      = 5 // Tag: why; the attachment is gone
)

// EventBody is the JSON body of EVENT.
type EventBody struct {
	Leader   string   `json:"leader,omitempty"`
	Member   *Member  `json:"member,omitempty"`
	Members  []Member `json:"members,omitempty"`
	Patterns []string `json:"patterns,omitempty"`
	// Epoch and Term are the leader's fencing token in a cluster: the
	// home node's epoch and the exchange's term, compared in that order;
	// both only grow. Zero on a node alone.
	Epoch uint64 `json:"epoch,omitempty"`
	Term  uint64 `json:"term,omitempty"`
}

// SubRequestBody is the JSON body of SUBREQUEST.
type SubRequestBody struct {
	Member   Member   `json:"member"`
	Patterns []string `json:"patterns"`
}

// PatternsBody is the JSON body of SUBSCRIBE, UNSUBSCRIBE and DECISION.
type PatternsBody struct {
	Patterns []string `json:"patterns"`
}

// Decision verdicts, the Aux of DECISION.
const (
	VerdictAccept = 0
	VerdictRefuse = 1
)

// Task event kinds, the Aux of TASKEVENT.
const (
	TaskProgress  = 1 // a worker reported progress
	TaskRetry     = 2 // the task failed and will be delivered again
	TaskCompleted = 3 // a worker acked it; the last event
	TaskFailed    = 4 // it was dead-lettered; the last event
	TaskLost      = 5 // the watch ended without the outcome; the last event
)

// TaskEventBody is the JSON body of TASKEVENT.
type TaskEventBody struct {
	ID       uint64 `json:"id"`
	Percent  int    `json:"percent,omitempty"`
	Text     string `json:"text,omitempty"`
	Attempts uint32 `json:"attempts,omitempty"`
	DueMS    int64  `json:"due_ms,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Worker   string `json:"worker,omitempty"`
}
