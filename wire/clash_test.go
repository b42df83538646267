package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestExchangeConfigClash(t *testing.T) {
	tasks := ExchangeConfig{Pattern: PatternTasks, Strategy: StrategyCompeting, MaxAttempts: 5, DeadLetter: "dlx"}
	rr := ExchangeConfig{Pattern: PatternReqResp, Strategy: "round-robin"}
	for _, tc := range []struct {
		name       string
		have, want ExchangeConfig
		field      string // "" for no clash
	}{
		{"empty matches anything", tasks, ExchangeConfig{}, ""},
		{"same options", tasks, tasks, ""},
		{"other pattern", rr, ExchangeConfig{Pattern: PatternPubSub}, "pattern"},
		{"other strategy", rr, ExchangeConfig{Strategy: "sticky"}, "strategy"},
		{"controlled wanted", rr, ExchangeConfig{Controlled: true}, "controlled"},
		{"transient wanted", rr, ExchangeConfig{Transient: true}, "transient"},
		{"other max attempts", tasks, ExchangeConfig{MaxAttempts: 6}, "max_attempts"},
		{"other dead letter", tasks, ExchangeConfig{DeadLetter: "other"}, "dead_letter"},
		{"other overflow", tasks, ExchangeConfig{Overflow: OverflowDropHead}, "overflow"},
		{"task options ignored off tasks", rr, ExchangeConfig{MaxAttempts: 6}, ""},
		{"other amqp type", ExchangeConfig{Pattern: PatternPubSub, AMQPType: "direct"}, ExchangeConfig{Pattern: PatternPubSub, AMQPType: "fanout"}, "amqp_type"},
		{"same amqp type", ExchangeConfig{Pattern: PatternPubSub, AMQPType: "direct"}, ExchangeConfig{Pattern: PatternPubSub, AMQPType: "direct"}, ""},
		{"amqp type on an untyped exchange", ExchangeConfig{Pattern: PatternPubSub}, ExchangeConfig{Pattern: PatternPubSub, AMQPType: "topic"}, ""},
		{"no amqp type on a typed exchange", ExchangeConfig{Pattern: PatternPubSub, AMQPType: "topic"}, ExchangeConfig{Pattern: PatternPubSub}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.have.Clash("x", tc.want)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Clash: %v, want nil", err)
				}
				return
			}
			var we *Error
			if !errors.As(err, &we) || we.Code != CodeClash {
				t.Fatalf("Clash: %v, want a CodeClash error", err)
			}
			if !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), `"x"`) {
				t.Errorf("Clash: %q, want it to name exchange \"x\" and %s", err, tc.field)
			}
		})
	}
}

// TestReplicasClashAndRange: replicas 0 matches the number recorded,
// another number clashes; the range is 0 to MaxReplicas.
func TestReplicasClashAndRange(t *testing.T) {
	c := ExchangeConfig{Pattern: PatternTasks, Replicas: 3}
	if err := c.Clash("q", ExchangeConfig{Pattern: PatternTasks}); err != nil {
		t.Fatalf("replicas 0 against 3: %v", err)
	}
	if err := c.Clash("q", ExchangeConfig{Replicas: 3}); err != nil {
		t.Fatalf("replicas 3 against 3: %v", err)
	}
	err := c.Clash("q", ExchangeConfig{Replicas: 5})
	if err == nil || !strings.Contains(err.Error(), "replicas 3, not 5") {
		t.Fatalf("replicas 5 against 3: %v", err)
	}
	for _, n := range []int{-1, MaxReplicas + 1} {
		if err := (&ExchangeConfig{Pattern: PatternTasks, Replicas: n}).Check(); err == nil {
			t.Errorf("replicas %d passed Check", n)
		}
	}
	if err := (&ExchangeConfig{Pattern: PatternTasks, Replicas: MaxReplicas}).Check(); err != nil {
		t.Errorf("replicas %d: %v", MaxReplicas, err)
	}
}
