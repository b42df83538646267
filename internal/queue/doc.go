// Package queue is the core of Courier's task queues: messages,
// consumers with credit, acks, retries with backoff, dead letters, TTL,
// priorities, delayed delivery, keyed tasks, single-active consumers,
// progress events, live counters, and the journal records that make a
// queue durable. It knows nothing of the network or the broker: the
// broker maps attachments to [Consumer]s and frames to method calls.
//
// # Messages
//
// [Queue.Enqueue] assigns each message an id (increasing per queue) and
// puts it in one of these states:
//
//	Enqueue ─(due later)─▶ delayed ─(due)─▶ ready ─deliver─▶ in flight ─Ack─▶ gone
//	   └──────────(due now)───────────────────▶ ▲                  │
//	                                            └─backoff─◀────────┤ Nack(requeue), consumer gone
//	                                                               ├─ past MaxAttempts ─▶ dead letter
//	                                                               └─ Nack(no requeue) ─▶ dead letter
//
// A waiting message (delayed, ready, backing off) that outlives its TTL
// is dead-lettered with [ReasonExpired]; a message in flight does not
// expire. Dead letters go to [Config.DeadLetter] ([ToQueue] moves them to
// another queue) with a [Reason].
//
// Ready messages go out by priority (0 to [MaxPriority], higher first),
// FIFO within a level, messages being retried first.
//
// # Consumers
//
// [Queue.AddConsumer] attaches a consumer with a prefetch limit: it has
// at most that many messages in flight. Consumers compete: each ready
// message goes to the next consumer with credit, round-robin; when a
// consumer acks, it takes the next message itself. In single-active mode
// ([Config.SingleActive]) only the oldest consumer receives, until it
// goes away; [Queue.Active] and [Config.OnActive] tell which one.
//
// # Keyed tasks
//
// Messages with a [Message.Key] are delivered one at a time per key, in
// the order they became due: a key has at most one message in flight,
// and its next message waits until that one is settled. Keys are spread
// over the consumers by a consistent-hash ring with virtual nodes (on
// [ConsumerConfig.Tag]), so a key sticks to a consumer while it lives,
// and a consumer joining or leaving moves only its share of the keys. A
// key with a message in flight stays with its consumer until that
// message is settled. A failed message blocks only its own key while it
// backs off. Within a key, priorities do not reorder messages; across
// keys, the priority of each key's next message counts. A key's messages
// wait for its consumer's credit even if other consumers are idle: that
// is the price of order and stickiness.
//
// # Time
//
// Delayed messages, backoffs and expiries are kept in each queue's heap
// ordered by time, and each queue registers only its earliest deadline
// with a [Scheduler], shared by all the queues of a node: one runtime
// timer, no goroutine while idle, no timer per message. Due times are
// wall-clock times (they survive restarts), re-read at least every
// [SchedulerOptions.MaxSleep], so nothing drifts however long or many
// the waits. The clock is injectable ([Clock]) for tests.
//
// # Durability
//
// A queue with a [Config.Journal] writes a record for every change that
// must survive a crash (enqueue, failed attempt, release on ack or dead
// letter: see [Journal]) and confirms a publisher once its record is
// durable. [Recover] and [Rebuilder] rebuild a queue from those records.
// Record payloads are described in record.go. Message bodies are held
// behind an indirection (in memory, or only in the journal and read back
// on delivery), so that paging can evict them.
//
// # Deduplication
//
// A message may carry a producer id and a sequence number
// ([Message.Producer], [Message.Seq]): the queue stores one message per
// pair within [Config.DedupWindow] (2 minutes by default, at most
// [Config.DedupMax] pairs), and an enqueue of a pair it holds returns the
// first message's id, is confirmed once the first is durable, and stores
// nothing. The pair is in the enqueue record, so that [Recover] rebuilds
// the window, and in a snapshot, so that it outlives the records of
// settled messages. dedup.go says why a time-bounded map with a cap.
//
// # Memory and paging
//
// Every queue accounts what it keeps in RAM (about [MessageOverhead]
// bytes of index a message, plus the bodies and headers it holds) to the
// node's budget, [Config.Memory]. As the budget fills past [PageAt], a
// durable queue pages: bodies first (dropping the RAM copy of a body
// that is in the journal costs no write), then the index of its deep
// FIFOs, whose middle goes to runs written through the journal's
// [Spiller] (52 bytes a message) and read back in batches as the head
// drains, so that its RAM stays bounded whatever its depth. Messages
// with a key, delayed, backing off or in flight keep their index in RAM.
// [Queue.Pressure] tells the broker how hard to slow each queue's
// publishers as the memory's limit, above the budget, fills; consumers
// are never slowed. Transient queues do not page:
// their bytes count, and their publishers are slowed first. See
// spill.go and docs/queues.md.
//
// # Threading
//
// Each queue's state is guarded by its own mutex (Queue.mu); there is no
// goroutine per queue. Every method is safe for concurrent use and
// returns without waiting for consumers. Callbacks (Deliver, watchers,
// the dead-letter sink, OnActive) are never called with the lock held:
// state changes queue them, and the goroutine that made the change runs
// them after releasing the lock, in order, one goroutine at a time per
// queue. So they must not block, and they may call the queue back (an
// Ack from inside Deliver is fine). [Journal] methods are the exception:
// they are called with the lock held, in the order of the changes.
//
// Lock order: Queue.mu, then Scheduler.mu, then the journal's locks. The
// scheduler calls queues without its lock. [Queue.Stats],
// [Queue.Resident], [Queue.Pressure] and [Memory]'s methods take no lock.
// A publisher waits for the journal's flow control ([Admitter]) before
// it takes the lock; acks, nacks and deliveries never wait for it.
package queue
