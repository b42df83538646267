package wire

import (
	"errors"
	"strings"
	"testing"
)

// Numbers from the wire are checked against their ranges (issue 12,
// finding 9): 2^62 ms overflowed the conversion to nanoseconds.

const huge = 1 << 62

func TestExchangeConfigCheck(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  ExchangeConfig
		bad  string // the field named in the error; "" for none
	}{
		{"zero", ExchangeConfig{}, ""},
		{"all at most", ExchangeConfig{MaxAttempts: MaxMaxAttempts, TTLMS: MaxDurationMS, BackoffMS: MaxDurationMS, BackoffMaxMS: MaxDurationMS, MaxLength: MaxCount, MaxBytes: MaxCount}, ""},
		{"no attempts limit", ExchangeConfig{MaxAttempts: -1}, ""},
		{"attempts below -1", ExchangeConfig{MaxAttempts: -2}, "max_attempts"},
		{"attempts over 32 bits", ExchangeConfig{MaxAttempts: MaxMaxAttempts + 1}, "max_attempts"},
		{"ttl 2^62", ExchangeConfig{TTLMS: huge}, "ttl_ms"},
		{"ttl one over", ExchangeConfig{TTLMS: MaxDurationMS + 1}, "ttl_ms"},
		{"ttl negative", ExchangeConfig{TTLMS: -1}, "ttl_ms"},
		{"backoff 2^62", ExchangeConfig{BackoffMS: huge}, "backoff_ms"},
		{"backoff max 2^62", ExchangeConfig{BackoffMaxMS: huge}, "backoff_max_ms"},
		{"backoff negative", ExchangeConfig{BackoffMS: -5}, "backoff_ms"},
		{"max length 2^62", ExchangeConfig{MaxLength: huge}, "max_length"},
		{"max length negative", ExchangeConfig{MaxLength: -1}, "max_length"},
		{"max bytes one over", ExchangeConfig{MaxBytes: MaxCount + 1}, "max_bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.cfg.Check()
			switch {
			case c.bad == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.bad != "" && err == nil:
				t.Fatal("accepted")
			case c.bad != "" && (!strings.HasPrefix(err.Error(), c.bad+" ") || !errors.Is(err, errRange)):
				t.Fatalf("error %q does not name %s as out of range", err, c.bad)
			}
		})
	}
}

// An AMQP type is one of the four, on a pub-sub exchange only.
func TestExchangeConfigCheckAMQPType(t *testing.T) {
	for _, typ := range []string{"direct", "fanout", "topic", "headers"} {
		if err := (&ExchangeConfig{Pattern: PatternPubSub, AMQPType: typ}).Check(); err != nil {
			t.Fatalf("%s refused: %v", typ, err)
		}
	}
	for _, c := range []ExchangeConfig{
		{Pattern: PatternPubSub, AMQPType: "x-delayed"},
		{Pattern: PatternTasks, AMQPType: "direct"},
	} {
		if err := c.Check(); err == nil || !strings.HasPrefix(err.Error(), "amqp_type ") {
			t.Fatalf("%+v: %v, want amqp_type refused", c, err)
		}
	}
}

func TestHelloCheck(t *testing.T) {
	for _, c := range []struct {
		h   Hello
		bad bool
	}{
		{Hello{}, false},
		{Hello{HeartbeatMS: 500, MaxFrame: 1 << 20}, false},
		{Hello{HeartbeatMS: MaxDurationMS}, false},
		{Hello{HeartbeatMS: huge}, true},
		{Hello{HeartbeatMS: -1}, true},
		{Hello{MaxFrame: -1}, true},
		{Hello{MaxFrame: MaxFrameHint + 1}, true},
	} {
		if err := c.h.Check(); (err != nil) != c.bad {
			t.Errorf("%+v: error %v, want bad %v", c.h, err, c.bad)
		}
	}
}

func TestParseTaskOptionsRanges(t *testing.T) {
	for _, c := range []struct {
		tag  string
		want TaskOptions
		bad  bool
	}{
		{"", TaskOptions{}, false},
		{"due=1767225600000;ttl=60000", TaskOptions{DueMS: 1767225600000, TTLMS: 60000}, false},
		{"ttl=315360000000", TaskOptions{TTLMS: MaxDurationMS}, false},
		{"ttl=315360000001", TaskOptions{}, true},
		{"ttl=4611686018427387904", TaskOptions{}, true}, // 2^62
		{"ttl=9223372036854775807", TaskOptions{}, true},
		{"ttl=9223372036854775808", TaskOptions{}, true}, // not an int64
		{"ttl=-1", TaskOptions{}, true},
		{"due=9223372036854", TaskOptions{DueMS: MaxDueMS}, false},
		{"due=9223372036855", TaskOptions{}, true},
		{"due=4611686018427387904", TaskOptions{}, true},
		{"due=-1", TaskOptions{}, true},
		{"other=1", TaskOptions{}, true},
		{"pid=app-1.a:b_c;seq=7", TaskOptions{Producer: "app-1.a:b_c", Seq: 7}, false},
		{"ttl=5;pid=p;seq=9223372036854775807", TaskOptions{TTLMS: 5, Producer: "p", Seq: 1<<63 - 1}, false},
		{"pid=p", TaskOptions{}, true},
		{"seq=3", TaskOptions{}, true},
		{"pid=p;seq=0", TaskOptions{}, true},
		{"pid=;seq=1", TaskOptions{}, true},
		{"pid=a b;seq=1", TaskOptions{}, true},
		{"pid=" + strings.Repeat("x", MaxProducerLen+1) + ";seq=1", TaskOptions{}, true},
		{"pid=p;seq=-1", TaskOptions{}, true},
	} {
		o, err := ParseTaskOptions(c.tag)
		if (err != nil) != c.bad || !c.bad && o != c.want {
			t.Errorf("%q: %+v, %v; want %+v, bad %v", c.tag, o, err, c.want, c.bad)
		}
	}
}

func TestTaskOptionsTagRoundTrip(t *testing.T) {
	for _, o := range []TaskOptions{
		{}, {DueMS: 1}, {TTLMS: 2}, {Producer: "p", Seq: 1},
		{DueMS: 3, TTLMS: 4, Producer: strings.Repeat("z", MaxProducerLen), Seq: 1<<63 - 1},
	} {
		got, err := ParseTaskOptions(o.Tag())
		if err != nil || got != o {
			t.Errorf("%+v: tag %q parses as %+v, %v", o, o.Tag(), got, err)
		}
	}
}

func TestMaxDurationFitsNanoseconds(t *testing.T) {
	// Now plus the longest duration, in ns, must fit in an int64 until
	// well after 2200.
	const year2200 = 7258118400 * 1_000_000_000 // Unix ns
	if int64(MaxDurationMS)*1_000_000 > 1<<63-1-year2200 {
		t.Fatal("MaxDurationMS in ns overflows after 2200")
	}
}

// FuzzParseTaskOptions: a SUBMIT's Tag from the network never panics the
// parser, and what parses is in range and survives a round trip.
func FuzzParseTaskOptions(f *testing.F) {
	for _, s := range []string{"", "due=1;ttl=2", "pid=p;seq=1", "ttl=5;pid=c-ABC;seq=9223372036854775807", "pid=;seq=0", "seq=1;pid=a:b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tag string) {
		o, err := ParseTaskOptions(tag)
		if err != nil {
			return
		}
		if o.Producer != "" && (!ValidProducer(o.Producer) || o.Seq == 0 || o.Seq > 1<<63-1) {
			t.Fatalf("%q parsed to a bad pair %+v", tag, o)
		}
		back, err := ParseTaskOptions(o.Tag())
		if err != nil || back != o {
			t.Fatalf("%q: %+v re-encodes to %q: %+v, %v", tag, o, o.Tag(), back, err)
		}
	})
}
