package wire

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// TaskOptions are the rarely used options of a SUBMIT, carried in its Tag
// as "due=<unix ms>;ttl=<ms>" (either part may be missing), so that the
// common submit carries none.
type TaskOptions struct {
	// DueMS, if not 0, delays the task until this Unix time in
	// milliseconds.
	DueMS int64
	// TTLMS, if not 0, bounds how long the task may wait once due.
	TTLMS int64
}

// Tag returns the options' encoding for a SUBMIT's Tag: "" for none.
func (o TaskOptions) Tag() string {
	var b []byte
	if o.DueMS != 0 {
		b = append(b, "due="...)
		b = strconv.AppendInt(b, o.DueMS, 10)
	}
	if o.TTLMS != 0 {
		if len(b) > 0 {
			b = append(b, ';')
		}
		b = append(b, "ttl="...)
		b = strconv.AppendInt(b, o.TTLMS, 10)
	}
	return string(b)
}

// MaxDueMS is the latest due time a task may have, in Unix ms: the last
// millisecond whose Unix time in nanoseconds fits in 63 bits (April
// 2262). The server also refuses a due time more than MaxDurationMS
// ahead of its clock.
const MaxDueMS = math.MaxInt64 / 1_000_000

// ParseTaskOptions decodes a SUBMIT's Tag: due from 0 to MaxDueMS, ttl
// from 0 to MaxDurationMS.
func ParseTaskOptions(tag string) (TaskOptions, error) {
	var o TaskOptions
	for part := range strings.SplitSeq(tag, ";") {
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || n < 0 {
			return o, fmt.Errorf("bad task option %q: want due=<unix ms> or ttl=<ms>", part)
		}
		switch k {
		case "due":
			if n > MaxDueMS {
				return o, fmt.Errorf("task option due=%d %w: 0 to %d (Unix ms)", n, errRange, int64(MaxDueMS))
			}
			o.DueMS = n
		case "ttl":
			if err := checkMS("task option ttl", n); err != nil {
				return o, err
			}
			o.TTLMS = n
		default:
			return o, fmt.Errorf("unknown task option %q: want due or ttl", k)
		}
	}
	return o, nil
}
