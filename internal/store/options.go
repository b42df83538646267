package store

import (
	"fmt"
	"io"
	"log/slog"
	"time"
)

// SyncPolicy says when appended records are made durable and confirmed.
type SyncPolicy uint8

const (
	// GroupCommit syncs as soon as there is something to sync: appends
	// that arrive while a sync runs share the next one. A record is
	// confirmed when the sync that covers it returns. This is the default.
	GroupCommit SyncPolicy = iota
	// Interval syncs at most once per [Options.SyncInterval]; records are
	// still confirmed only after the sync that covers them, so confirms
	// arrive up to one interval later, in exchange for fewer syncs.
	Interval
)

func (p SyncPolicy) String() string {
	switch p {
	case GroupCommit:
		return "group-commit"
	case Interval:
		return "interval"
	}
	return fmt.Sprintf("SyncPolicy(%d)", uint8(p))
}

// Limits of the format.
const (
	// MaxSegmentSize is the largest [Options.SegmentSize]: offsets are 32
	// bits.
	MaxSegmentSize = 1 << 31
	// MinSegmentSize is the smallest [Options.SegmentSize]; small segments
	// are for tests.
	MinSegmentSize = 4 << 10
)

// Options configure a [Log]. Start from [DefaultOptions]; [Open] calls
// [Options.Validate].
type Options struct {
	// SegmentSize is the size at which the active segment is sealed and a
	// new one started. A segment is the unit of deletion: it is deleted
	// when every record in it has been released. Larger segments mean
	// fewer files and fsyncs on rollover; smaller ones give disk space
	// back sooner. Between [MinSegmentSize] and [MaxSegmentSize].
	// Default: 64 MiB.
	SegmentSize int64

	// MaxRecordSize is the largest payload [Log.Append] accepts. It must
	// leave room in a segment for the segment and record headers.
	// Default: 16 MiB (or less, to fit a small SegmentSize).
	MaxRecordSize int

	// Sync is the durability policy. Default: [GroupCommit].
	Sync SyncPolicy

	// SyncInterval is how often the [Interval] policy syncs. Ignored by
	// [GroupCommit]. Default: 10ms.
	SyncInterval time.Duration

	// MaxPending bounds the bytes appended but not yet handed to the
	// kernel. [Log.Append] blocks while it is reached: this is the
	// store's flow control, so that a slow disk slows publishers instead
	// of growing memory. Default: 8 MiB.
	MaxPending int

	// MinFreeDisk is the free space, in bytes, under which the disk
	// alarm goes on ([Log.DiskAlarm]): the broker then slows the
	// publishers of durable queues until it clears, when the free space
	// is back above MinFreeDisk plus one SegmentSize. The log itself goes
	// on appending (it fails only when the disk is full). Checked every
	// DiskCheckInterval and whenever a segment is started, on an [FS]
	// that is a [Spacer]. Negative disables the check. Default: 1 GiB.
	MinFreeDisk int64

	// DiskCheckInterval is how often the free space is checked. Default: 1s.
	DiskCheckInterval time.Duration

	// ScrubRate, when positive, makes Open start a background check of
	// what it did not verify (the records before the last checkpoint),
	// reading at most ScrubRate bytes a second, once: it reports records
	// whose checksum fails in the log and in [Stats.DamagedRecords]
	// (see scrub.go). Default: 0, no check; the node sets 64 MiB/s.
	ScrubRate int64

	// Logger receives rare events: segments deleted or failing to delete,
	// the first write error. Recovery is reported to the caller, not
	// logged. Default: a logger that discards.
	Logger *slog.Logger

	// now is the clock, replaceable by tests.
	now func() time.Time
}

// DefaultOptions returns the options documented on each field.
func DefaultOptions() Options {
	return Options{
		SegmentSize:       64 << 20,
		MaxRecordSize:     16 << 20,
		Sync:              GroupCommit,
		SyncInterval:      10 * time.Millisecond,
		MaxPending:        8 << 20,
		MinFreeDisk:       1 << 30,
		DiskCheckInterval: time.Second,
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
		now:               time.Now,
	}
}

// ensureDefaults fills zero fields with their defaults, so that a
// hand-built Options{SegmentSize: 1 << 20} works.
func (o *Options) ensureDefaults() {
	d := DefaultOptions()
	if o.SegmentSize == 0 {
		o.SegmentSize = d.SegmentSize
	}
	if o.MaxRecordSize == 0 {
		o.MaxRecordSize = d.MaxRecordSize
		if limit := int(o.SegmentSize) - segHeaderSize - recHeaderSize; o.MaxRecordSize > limit && limit > 0 {
			o.MaxRecordSize = limit
		}
	}
	if o.SyncInterval == 0 {
		o.SyncInterval = d.SyncInterval
	}
	if o.MaxPending == 0 {
		o.MaxPending = d.MaxPending
	}
	if o.MinFreeDisk == 0 {
		o.MinFreeDisk = d.MinFreeDisk
	}
	if o.DiskCheckInterval <= 0 {
		o.DiskCheckInterval = d.DiskCheckInterval
	}
	if o.Logger == nil {
		o.Logger = d.Logger
	}
	if o.now == nil {
		o.now = d.now
	}
}

// Validate reports the first invalid field, after filling zero fields with
// their defaults.
func (o Options) Validate() error {
	o.ensureDefaults()
	switch {
	case o.SegmentSize < MinSegmentSize || o.SegmentSize > MaxSegmentSize:
		return fmt.Errorf("store: SegmentSize %d not in [%d, %d]", o.SegmentSize, MinSegmentSize, MaxSegmentSize)
	case o.MaxRecordSize < 0 || int64(o.MaxRecordSize)+segHeaderSize+recHeaderSize > o.SegmentSize:
		return fmt.Errorf("store: MaxRecordSize %d does not fit a %d-byte segment", o.MaxRecordSize, o.SegmentSize)
	case o.Sync != GroupCommit && o.Sync != Interval:
		return fmt.Errorf("store: unknown sync policy %v", o.Sync)
	case o.SyncInterval < 0:
		return fmt.Errorf("store: negative SyncInterval %v", o.SyncInterval)
	case o.MaxPending < 0:
		return fmt.Errorf("store: negative MaxPending %d", o.MaxPending)
	case o.ScrubRate < 0:
		return fmt.Errorf("store: negative ScrubRate %d", o.ScrubRate)
	}
	return nil
}
