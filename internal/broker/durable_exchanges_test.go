package broker

import (
	"encoding/binary"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/wire"
)

// TestDurableExchanges: request-response and pub-sub exchanges come back
// after a crash, from a checkpoint and from the records after it, with
// their configuration; a transient one, a deleted one and one routed by
// a Go function do not.
func TestDurableExchanges(t *testing.T) {
	fs := store.NewMemFS()
	open := func(fs *store.MemFS) *Broker {
		t.Helper()
		b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if _, err := b.OpenStore(StoreConfig{Dir: "store", FS: fs, CheckpointEvery: time.Hour, CheckpointBytes: 1 << 40}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	cfgs := map[string]wire.ExchangeConfig{
		"cp.leader":    {Pattern: wire.PatternReqResp, Strategy: Leader},
		"cp.sticky":    {Pattern: wire.PatternReqResp, Strategy: StickyFun, KeyExpr: `key + "x"`},
		"cp.gone":      {Pattern: wire.PatternReqResp},
		"log.fun":      {Pattern: wire.PatternReqResp, Strategy: Fun, RouteExpr: `{"key": key}`},
		"log.control":  {Pattern: wire.PatternPubSub, Controlled: true},
		"log.gone":     {Pattern: wire.PatternPubSub},
		"cp.transient": {Pattern: wire.PatternReqResp, Transient: true},
	}
	declare := func(b *Broker, names ...string) {
		t.Helper()
		for _, name := range names {
			if _, err := b.Declare(name, Spec{ExchangeConfig: cfgs[name]}); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := open(fs)
	defer b.Close()
	declare(b, "cp.leader", "cp.sticky", "cp.gone", "cp.transient")
	if _, err := b.Declare("cp.gofunc", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: StickyFun},
		KeyFunc: func(*courier.RouteInput) string { return "" }}); err != nil {
		t.Fatal(err)
	}
	if err := b.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	declare(b, "log.fun", "log.control", "log.gone")
	for _, name := range []string{"cp.gone", "log.gone"} {
		if err := b.Delete(name); err != nil {
			t.Fatal(err)
		}
	}

	b2 := open(fs.Crash(nil))
	defer b2.Close()
	check := func(b *Broker, how string) {
		t.Helper()
		for name, cfg := range cfgs {
			ex := b.Exchange(name)
			switch {
			case name == "cp.gone" || name == "log.gone" || cfg.Transient:
				if ex != nil {
					t.Errorf("%s: exchange %s came back", how, name)
				}
			case ex == nil:
				t.Errorf("%s: exchange %s is gone", how, name)
			default:
				want := cfg
				if want.Pattern == wire.PatternReqResp && want.Strategy == "" {
					want.Strategy = Broadcast
				}
				if got := ex.Config(); got != want {
					t.Errorf("%s: exchange %s is %+v, not %+v", how, name, got, want)
				}
			}
		}
		if b.Exchange("cp.gofunc") != nil {
			t.Errorf("%s: the exchange routed by a Go function came back", how)
		}
	}
	check(b2, "after a crash")
	// Again from a checkpoint alone, and with a declaration after it.
	if err := b2.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	b3 := open(fs.Crash(nil))
	defer b3.Close()
	check(b3, "after a checkpoint and a crash")
}

// TestStateVersion1 reads a checkpoint's state as it was written before
// exchanges were durable (version 1: no exchange definitions).
func TestStateVersion1(t *testing.T) {
	b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if _, err := b.OpenStore(StoreConfig{Dir: "store", FS: store.NewMemFS(), CheckpointEvery: time.Hour, CheckpointBytes: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := b.Declare("jobs", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternTasks, MaxAttempts: 3}}); err != nil {
		t.Fatal(err)
	}
	b.dur.mu.Lock()
	v2 := b.dur.snapshot()
	b.dur.mu.Unlock()
	if v2[4] != 2 || binary.LittleEndian.Uint32(v2[len(v2)-4:]) != 0 {
		t.Fatalf("state version %d, its exchange count %d: want 2 and 0", v2[4], binary.LittleEndian.Uint32(v2[len(v2)-4:]))
	}
	v1 := append([]byte(nil), v2[:len(v2)-4]...)
	v1[4] = 1
	r := &recovering{defs: map[uint32]queueDef{}, rbs: map[uint32]*queue.Rebuilder{}}
	if err := r.loadState(b.dur, v1); err != nil {
		t.Fatalf("version 1: %v", err)
	}
	if len(r.defs) != 1 {
		t.Fatalf("version 1: %d definitions, want 1", len(r.defs))
	}
	for _, def := range r.defs {
		if def.Name != "jobs" || def.Config.MaxAttempts != 3 || def.ExchangeOnly {
			t.Errorf("version 1: definition %+v", def)
		}
	}
	if err := r.loadState(b.dur, append(v1[:len(v1):len(v1)], 0, 0, 0, 0)); err == nil {
		t.Error("version 1 with bytes after its queues: no error")
	}
}
