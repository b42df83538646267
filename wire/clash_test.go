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
