package meta

import (
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/internal/broker"
	"github.com/courier-mq/courier/wire"
)

func code(err error) wire.Code {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Code
	}
	if err != nil {
		return 255
	}
	return 0
}

// TestDeclareMatchesTheBroker declares pairs of configurations on a
// broker and on the state machine: the second declaration matches or
// clashes on both alike (the state machine reimplements the broker's
// match, as it cannot import the broker).
func TestDeclareMatchesTheBroker(t *testing.T) {
	rr := func(s string) wire.ExchangeConfig {
		return wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: s}
	}
	tasks := func(f func(*wire.ExchangeConfig)) wire.ExchangeConfig {
		c := wire.ExchangeConfig{Pattern: wire.PatternTasks}
		if f != nil {
			f(&c)
		}
		return c
	}
	cfgs := []wire.ExchangeConfig{
		{}, rr(""), rr("broadcast"), rr("round-robin"), rr("leader"), {Pattern: wire.PatternReqResp, Transient: true},
		{Pattern: wire.PatternPubSub}, {Pattern: wire.PatternPubSub, Controlled: true}, {Pattern: wire.PatternPubSub, Transient: true},
		tasks(nil), tasks(func(c *wire.ExchangeConfig) { c.Strategy = wire.StrategyCompeting }),
		tasks(func(c *wire.ExchangeConfig) { c.Strategy = wire.StrategySingleActive }),
		tasks(func(c *wire.ExchangeConfig) { c.MaxAttempts = 5 }), tasks(func(c *wire.ExchangeConfig) { c.TTLMS = 1000 }),
		tasks(func(c *wire.ExchangeConfig) { c.BackoffMS, c.BackoffMaxMS = 10, 100 }),
		tasks(func(c *wire.ExchangeConfig) { c.DeadLetter = "dl" }), tasks(func(c *wire.ExchangeConfig) { c.MaxLength = 10 }),
		tasks(func(c *wire.ExchangeConfig) { c.MaxBytes = 1000; c.Overflow = wire.OverflowDropHead }),
	}
	for i, first := range cfgs {
		for j, second := range cfgs {
			b := broker.New(broker.Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
			_, err1 := b.Declare("x", broker.Spec{ExchangeConfig: first})
			_, err2 := b.Declare("x", broker.Spec{ExchangeConfig: second})
			b.Close()

			f := newFSM(nil, 1<<20)
			r1, _ := f.apply(1, &command{Op: opDeclare, Name: "x", Config: &first, Home: "n1"})
			r2, _ := f.apply(2, &command{Op: opDeclare, Name: "x", Config: &second, Home: "n1"})
			if code(err1) != code(r1.Err) {
				t.Errorf("cfg %d %+v alone: broker %v, meta %v", i, first, err1, r1.Err)
				continue
			}
			if err1 == nil && code(err2) != code(r2.Err) {
				t.Errorf("cfg %d %+v then %d %+v: broker %v, meta %v", i, first, j, second, err2, r2.Err)
			}
		}
	}
}

func TestValidNameIsTheBrokers(t *testing.T) {
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'a'
	}
	for _, name := range []string{"a", "a.b", "a-b_c:d", "", ".", "a.", ".a", "a..b", "a b", "a/b", "é", string(long), string(long[:255])} {
		if validName(name) != broker.ValidName(name) {
			t.Errorf("%q: meta %v, broker %v", name, validName(name), broker.ValidName(name))
		}
	}
	if string(courier.Broadcast) != "broadcast" {
		t.Fatal("default strategy renamed")
	}
}
