package broker

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/auth"
	"github.com/courier-mq/courier/internal/queue"
	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/wire"
)

// TestDeadLetterDeclarerDurable: a task exchange's declarer is stored
// with its definition and checked again after a restart: a user's, the
// anonymous user's (also what a definition stored before declarers has),
// and a trusted one. A declaration again by a user who may write to the
// dead_letter exchange restores the dead letters of an exchange whose
// declarer may not, durably.
func TestDeadLetterDeclarerDurable(t *testing.T) {
	pol := newFakePolicy()
	pol.set("alice", "dl", auth.Write)
	pol.set("bob", "dl", auth.Write)
	fs := store.NewMemFS()
	open := func() *Broker {
		t.Helper()
		b := New(Config{Log: slog.New(slog.DiscardHandler), Policy: pol})
		if _, err := b.OpenStore(StoreConfig{Dir: "store", FS: fs, CheckpointEvery: time.Hour, CheckpointBytes: 1 << 40}); err != nil {
			t.Fatal(err)
		}
		return b
	}
	tasks := func(dl string) Spec {
		return Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternTasks, DeadLetter: dl}}
	}
	b := open()
	if _, err := b.Declare("dl", tasks("")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeclareAs("alice.t", tasks("dl"), Declarer{User: "alice", Policy: pol}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Declare("trusted.t", tasks("dl")); err != nil {
		t.Fatal(err)
	}
	_, err := b.DeclareAs("carol.t", tasks("dl"), Declarer{User: "carol", Policy: pol})
	if we, ok := err.(*wire.Error); !ok || we.Code != wire.CodeUnauthorized {
		t.Fatalf("carol, who may not write to dl, declared: %v", err)
	}
	// The anonymous user of a node without users, which the policy later
	// denies everything, as a node that got users does.
	pol.set("", "dl", auth.Write)
	if _, err := b.DeclareAs("anon.t", tasks("dl"), Declarer{Policy: pol}); err != nil {
		t.Fatal(err)
	}
	tq, _ := b.queues.Load("anon.t")
	if def := string(jsonBody(tq.(*taskQueue).def)); strings.Contains(def, "declared_by") || strings.Contains(def, "trusted") {
		t.Fatalf("an anonymous declarer's definition %s differs from one stored before declarers", def)
	}
	b.Close()

	pol.set("", "dl", 0)
	pol.set("alice", "dl", 0)
	b = open()
	deadLetter := func(name string) (delivered bool) {
		t.Helper()
		v, _ := b.queues.Load(name)
		tq := v.(*taskQueue)
		before := b.Queue("dl").Stats().Messages()
		tq.deadLetter(queue.DeadLetter{Queue: name, Reason: queue.ReasonRejected, Message: queue.Delivery{Body: []byte(name)}})
		return b.Queue("dl").Stats().Messages() == before+1
	}
	for name, want := range map[string]bool{"alice.t": false, "anon.t": false, "trusted.t": true} {
		if got := deadLetter(name); got != want {
			t.Errorf("after the restart, %s's dead letter delivered: %v, want %v", name, got, want)
		}
	}
	if d := b.Exchange("alice.t").Info().Queue.DeadLetterDropped; d != 1 {
		t.Errorf("alice.t dropped %d dead letters, want 1", d)
	}

	// Bob, who may write to dl, declares anon.t again with its
	// dead_letter: he becomes its declarer. A passive declaration, or
	// one by a user who may not write to dl, changes nothing.
	if _, err := b.DeclareAs("alice.t", Spec{ExchangeConfig: tasks("dl").ExchangeConfig, Passive: true}, Declarer{User: "bob", Policy: pol}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeclareAs("alice.t", tasks("dl"), Declarer{User: "carol", Policy: pol}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeclareAs("anon.t", tasks("dl"), Declarer{User: "bob", Policy: pol}); err != nil {
		t.Fatal(err)
	}
	if !deadLetter("anon.t") || deadLetter("alice.t") {
		t.Fatal("declared again: bob's exchange should dead-letter, alice's not")
	}
	b.Close()
	b = open()
	defer b.Close()
	if !deadLetter("anon.t") || deadLetter("alice.t") {
		t.Fatal("after a restart: bob's exchange should dead-letter, alice's not")
	}
}
