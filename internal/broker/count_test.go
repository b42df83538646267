package broker

import (
	"fmt"
	"log/slog"

	"github.com/courier-mq/courier/wire"
	"testing"
)

// TestExchangeCountCached: the count follows every declare and delete,
// and is not walked again while nothing changes.
func TestExchangeCountCached(t *testing.T) {
	b := New(Config{Log: slog.New(slog.DiscardHandler)})
	defer b.Close()
	const n = 100
	for i := range n {
		if _, err := b.Declare(fmt.Sprintf("x.%d", i), Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}); err != nil {
			t.Fatal(err)
		}
		if got := b.ExchangeCount(); got != i+1 {
			t.Fatalf("after %d declares: %d exchanges", i+1, got)
		}
	}
	walks := exchangeCounts.Load()
	for range 1000 {
		if got := b.ExchangeCount(); got != n {
			t.Fatalf("%d exchanges, want %d", got, n)
		}
	}
	if w := exchangeCounts.Load() - walks; w != 0 {
		t.Errorf("1,000 counts with no change walked the table %d times, want 0", w)
	}
	if err := b.Delete("x.7"); err != nil {
		t.Fatal(err)
	}
	if got := b.ExchangeCount(); got != n-1 {
		t.Errorf("after a delete: %d exchanges, want %d", got, n-1)
	}
	if _, err := b.Declare("x.7", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}}); err != nil {
		t.Fatal(err)
	}
	if got := b.ExchangeCount(); got != n {
		t.Errorf("after declaring again: %d exchanges, want %d", got, n)
	}
}
