package node

import "testing"

// TestMemorySizes: the budget and the high watermark as the queues get
// them, and the Go memory limit courier server derives, for each way of
// setting them (-1: none; 0: the default).
func TestMemorySizes(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		budget, watermark ByteSize
		limit, pageBudget int64
		goLimit           int64
	}{
		{32 * mib, 1024 * mib, 1024 * mib, 32 * mib, 1536*mib + 32*mib},
		{2048 * mib, 1024 * mib, 2048 * mib, 2048 * mib, 3072*mib + 32*mib}, // the watermark is at least the budget
		{-1, 1024 * mib, 1024 * mib, 1024 * mib, 1536*mib + 32*mib},         // no budget: page from half the watermark
		{32 * mib, -1, noWatermark, 32 * mib, 0},                            // no watermark: no alarm, no Go limit
		{-1, -1, 0, 0, 0},
	} {
		limit, pageBudget := memorySizes(tc.budget, tc.watermark)
		if limit != tc.limit || pageBudget != tc.pageBudget {
			t.Errorf("budget %v, watermark %v: limit %d, budget %d; want %d, %d", tc.budget, tc.watermark, limit, pageBudget, tc.limit, tc.pageBudget)
		}
		if got := GoMemoryLimit(tc.budget, tc.watermark); got != tc.goLimit {
			t.Errorf("budget %v, watermark %v: Go memory limit %d, want %d", tc.budget, tc.watermark, got, tc.goLimit)
		}
	}
	// The defaults: 32 MiB, and 40% of the machine.
	if got, want := GoMemoryLimit(0, 0), GoMemoryLimit(DefaultMemoryBudget, defaultHighWatermark()); got != want || got <= 0 {
		t.Errorf("default Go memory limit %d, want %d", got, want)
	}
	cfg := Config{}
	cfg.setDefaults()
	if cfg.MemoryBudget != DefaultMemoryBudget || cfg.MemoryHighWatermark != defaultHighWatermark() {
		t.Errorf("defaults: budget %v, watermark %v", cfg.MemoryBudget, cfg.MemoryHighWatermark)
	}
	if m := cfg.memory(); m.Budget() != int64(DefaultMemoryBudget) || m.Limit() != int64(defaultHighWatermark()) {
		t.Errorf("default memory: budget %d, limit %d", m.Budget(), m.Limit())
	}
	if err := (Config{Name: "n", MemoryHighWatermark: -2}).Validate(); err == nil {
		t.Error("a watermark of -2 is valid")
	}
}
