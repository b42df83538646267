package wire

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// TaskOptions are the rarely used options of a SUBMIT, carried in its Tag
// as "due=<unix ms>;ttl=<ms>;pid=<producer>;seq=<n>" (any part may be
// missing), so that the common submit carries none.
type TaskOptions struct {
	// DueMS, if not 0, delays the task until this Unix time in
	// milliseconds.
	DueMS int64
	// TTLMS, if not 0, bounds how long the task may wait once due.
	TTLMS int64
	// Producer and Seq, when Producer is not empty, name the submit for
	// deduplication: the queue stores one task per (Producer, Seq)
	// within its window and confirms a resend with the first one's task
	// id. Producer is 1 to MaxProducerLen bytes of [A-Za-z0-9._:-]; Seq
	// is from 1 to 2^63-1. A server supports them if its WELCOME says
	// "dedup": true.
	Producer string
	Seq      uint64
}

// MaxProducerLen bounds a producer id.
const MaxProducerLen = 64

// ValidProducer reports whether p is a well-formed producer id.
func ValidProducer(p string) bool {
	if len(p) == 0 || len(p) > MaxProducerLen {
		return false
	}
	for i := range len(p) {
		c := p[i]
		ok := c == '.' || c == '_' || c == ':' || c == '-' ||
			('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
		if !ok {
			return false
		}
	}
	return true
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
	if o.Producer != "" {
		if len(b) > 0 {
			b = append(b, ';')
		}
		b = append(b, "pid="...)
		b = append(b, o.Producer...)
		b = append(b, ";seq="...)
		b = strconv.AppendUint(b, o.Seq, 10)
	}
	return string(b)
}

// MaxDueMS is the latest due time a task may have, in Unix ms: the last
// millisecond whose Unix time in nanoseconds fits in 63 bits (April
// 2262). The server also refuses a due time more than MaxDurationMS
// ahead of its clock.
const MaxDueMS = math.MaxInt64 / 1_000_000

// ParseTaskOptions decodes a SUBMIT's Tag: due from 0 to MaxDueMS, ttl
// from 0 to MaxDurationMS, pid a producer id ([ValidProducer]) and seq
// from 1, both or neither.
func ParseTaskOptions(tag string) (TaskOptions, error) {
	var o TaskOptions
	for part := range strings.SplitSeq(tag, ";") {
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if ok && k == "pid" {
			if !ValidProducer(v) {
				return o, fmt.Errorf("bad task option pid: want 1 to %d bytes of [A-Za-z0-9._:-]", MaxProducerLen)
			}
			o.Producer = v
			continue
		}
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
		case "seq":
			if n == 0 {
				return o, fmt.Errorf("task option seq=0 %w: 1 to 2^63-1", errRange)
			}
			o.Seq = uint64(n)
		default:
			return o, fmt.Errorf("unknown task option %q: want due, ttl, pid or seq", k)
		}
	}
	if (o.Producer == "") != (o.Seq == 0) {
		return o, fmt.Errorf("task options pid and seq go together")
	}
	return o, nil
}
