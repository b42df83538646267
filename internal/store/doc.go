// Package store is Courier's durable log: one segmented, append-only log
// per node, shared by every durable queue, with group commit, per-record
// checksums, checkpoints and deletion of dead segments.
//
// # Model
//
// A node may hold 100,000 queues, so queues do not get files of their
// own: every queue appends to the same [Log], and each record carries its
// queue id and a [Kind]. [Log.Append] returns the record's [Ref] at once
// and calls its done callback once the record is durable; the caller
// confirms to its publisher only then. The caller (the queue layer) keeps
// its own index of refs, reads records back with [Log.Read] (one pread,
// checksum verified), and calls [Log.Release] when a record is dead
// (acked, expired). Every so often it calls [Log.Checkpoint] with its
// serialized state; [Open] returns the last checkpoint's state, and
// [Log.Replay] hands over only the records written after it, so restart
// time follows what was written since the last checkpoint, not the depth
// of the queues.
//
// # Durability
//
// Under [GroupCommit] (the default), a writer goroutine takes everything
// appended since its last round, writes it with one pwrite, and hands it
// to a syncer goroutine that fdatasyncs it and then calls the done
// callbacks; appends arriving during a sync share the next one, and
// writing the next batch overlaps the current sync. Under [Interval], the
// syncer syncs at most every [Options.SyncInterval]; done is still called
// only after the sync. A new segment file's directory entry is synced
// before anything in it is confirmed. A failed write or sync fails every
// unconfirmed record and the log ([ErrFailed]): after a failed fsync the
// kernel may have dropped the data, so nothing later could be trusted.
//
// # On disk
//
// A log directory holds segment files, a checkpoint and a lock file:
//
//	00000001.seg  00000002.seg  ...   segments, named by number in hex
//	CHECKPOINT                        the last checkpoint
//	CHECKPOINT.tmp                    a checkpoint being written (removed by Open)
//	LOCK                              flock'd by the open Log; its PID
//
// A segment is a 16-byte header followed by records, little-endian:
//
//	segment:  +--------+----+-------+---------+---------+--------+----
//	          | "CRSG" | v1 | 0 0 0 | seg u32 | crc u32 | record | ...
//	          +--------+----+-------+---------+---------+--------+----
//	                                   crc: CRC-32C of the first 12 bytes
//
//	record:   +---------+---------+-----------+---------+-------+----------+
//	          | crc u32 | len u32 | queue u32 | kind u8 | 0 x 3 | payload  |
//	          +---------+---------+-----------+---------+-------+----------+
//	           0         4         8           12        13      16    16+len
//	          crc: CRC-32C (Castagnoli) of bytes 4 to 16+len: the rest of the
//	          header and the payload
//
// A [Pos] is (segment number, byte offset of a record header); a [Ref]
// adds the payload length. Kind 0 is invalid, so zeroed space never
// passes for a record; kinds from [KindReserved] are the store's. A
// [KindRelease] record's payload is a list of (seg u32, off u32, len u32)
// entries, the refs it releases. The checkpoint file's layout is in
// checkpoint.go and docs/storage-format.md.
//
// # Recovery
//
// [Open] reads the checkpoint, then verifies every record from the
// checkpoint's position to the end. At the first record that does not
// check (short, bad header, bad checksum) in the last segment, the tail
// is cut: the file is truncated there and appends go to a new segment,
// so no position is ever reused. A record cut short by the end of an
// earlier segment (one round of writes can span segments) is cut too.
// Other damage is stepped over and reported. Open reports everything in a [Recovery] and fails only
// on I/O errors, never on bad data, so a damaged log cannot make a node
// crash in a loop.
//
// # Deleting segments
//
// Each segment counts its live records: Append adds one, Release takes
// one away. A segment is deleted when all of these hold:
//
//   - it is sealed (not the segment appends go to);
//   - no record in it is live;
//   - the release record that brought it to zero is durable, so a crash
//     cannot bring back records whose segment is gone;
//   - it lies wholly before the last durable checkpoint's position. The
//     segments from the checkpoint on are what Replay reads after a
//     crash: the release records in them are the only durable trace of
//     acks made since the checkpoint, so deleting one would resurrect
//     the records it released, in segments that may be gone too.
//
// The live counts are themselves recovered: the checkpoint stores them
// as of its cut, and Open applies the release records after it. A
// release record updates the counts under the same lock that gives it
// its position, so a checkpoint's cut always sees a release and its
// record together or neither. Disk use thus follows the live backlog, a
// checkpoint interval behind. A segment kept alive by a few old records
// (a stuck queue) is not compacted by the store, which does not know
// which records are live: the caller copies them forward (see
// [Log.Segments]).
//
// # Runs and alarms
//
// Besides segments, a log keeps runs ([Log.WriteRun]): immutable side
// files in which a queue pages out the index of its deep FIFOs. They are
// synced by the next [Log.Checkpoint], which may name them in its state,
// and deleted after the checkpoint that follows [Log.DropRun]. The log
// also watches its disk's free space ([Options.MinFreeDisk],
// [Log.DiskAlarm]) for the broker's flow control.
//
// # Flow control
//
// [Log.Append] waits while [Options.MaxPending] bytes are pending;
// [Log.Release] never waits, so that acks never queue behind publishers.
// A caller that appends under a lock of its own waits first with
// [Log.WaitSpace], without the lock, then appends with
// [Log.AppendNoWait].
//
// # Concurrency
//
// Every method of [Log] is safe for concurrent use. Done callbacks run
// on the syncer goroutine, in log order; they must not block, nor call
// Sync, Checkpoint or Close. Read and Replay run concurrently with
// appends; Read waits for a record still being written.
package store
