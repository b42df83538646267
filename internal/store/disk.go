package store

import "time"

// The disk alarm: the log watches the free space of its disk (on an FS
// that is a Spacer) and raises an alarm below Options.MinFreeDisk, for
// the broker to slow publishers. It does not refuse appends itself: the
// alarm comes early enough for flow control to act, and a full disk
// fails the log (ErrFailed) as any write error does.

// DiskAlarm reports whether the free space of the log's disk is below
// [Options.MinFreeDisk] (and has not yet come back above it plus one
// segment). It reads an atomic: call it as often as needed.
func (l *Log) DiskAlarm() bool { return l.diskAlarm.Load() }

// DiskFree returns the free space of the log's disk at the last check,
// or -1 if it is not known (the FS is not a [Spacer], or the check is
// disabled or failed).
func (l *Log) DiskFree() int64 { return l.diskFree.Load() }

// checkDisk measures the free space and sets or clears the alarm.
func (l *Log) checkDisk() {
	sp, ok := l.fs.(Spacer)
	if !ok || l.opts.MinFreeDisk < 0 {
		l.diskFree.Store(-1)
		return
	}
	free, err := sp.FreeSpace(l.dir)
	if err != nil {
		l.diskFree.Store(-1)
		return
	}
	l.diskFree.Store(free)
	switch on := l.diskAlarm.Load(); {
	case !on && free < l.opts.MinFreeDisk:
		if l.diskAlarm.CompareAndSwap(false, true) {
			l.opts.Logger.Warn("store: disk alarm: free space below the limit; publishers are slowed until it clears",
				"dir", l.dir, "free", free, "limit", l.opts.MinFreeDisk)
		}
	case on && free >= l.opts.MinFreeDisk+l.opts.SegmentSize:
		if l.diskAlarm.CompareAndSwap(true, false) {
			l.opts.Logger.Info("store: disk alarm cleared", "dir", l.dir, "free", free, "limit", l.opts.MinFreeDisk)
		}
	}
}

// diskTicker returns the channel of the janitor's periodic disk check,
// and a function that stops it.
func (l *Log) diskTicker() (<-chan time.Time, func()) {
	if _, ok := l.fs.(Spacer); !ok || l.opts.MinFreeDisk < 0 {
		return nil, func() {}
	}
	t := time.NewTicker(l.opts.DiskCheckInterval)
	return t.C, t.Stop
}
