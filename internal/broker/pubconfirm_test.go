package broker

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier/internal/store"
	"github.com/courier-mq/courier/internal/testutil"
	"github.com/courier-mq/courier/wire"
)

// frameSink hands a session's frames to the test.
type frameSink chan *wire.Frame

func (c frameSink) Deliver(f *wire.Frame) { c <- f }

// openDurable opens a broker on fs with a pub-sub exchange "events" and
// two durable subscriptions, events/all (a.#) and events/ab (a.b).
func openDurable(t testing.TB, fs *store.MemFS) *Broker {
	t.Helper()
	b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if _, err := b.OpenStore(StoreConfig{Dir: "store", FS: fs, CheckpointEvery: time.Hour, CheckpointBytes: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	ev, err := b.Declare("events", Spec{ExchangeConfig: wire.ExchangeConfig{Pattern: wire.PatternPubSub}})
	if err != nil {
		t.Fatal(err)
	}
	for sub, p := range map[string]string{"all": "a.#", "ab": "a.b"} {
		if _, err := b.durableSub(ev, sub, []string{p}, nil); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func confirmedPublish(ref uint64, key string) *wire.Frame {
	f := wire.NewFrame(wire.TypePublish)
	f.Name, f.Key, f.Body, f.Ref, f.Flags = "events", key, []byte(key), ref, wire.FlagReply
	return f
}

// TestPublishConfirmWaitsForFsync: a PUBLISH with flag Reply routed to
// durable subscriptions is answered only once the store has fsynced it
// in each, and then it survives a crash; one routed to none is answered
// at once, fsync or not.
func TestPublishConfirmWaitsForFsync(t *testing.T) {
	fs := store.NewMemFS()
	b := openDurable(t, fs)
	defer b.Close()

	var hold atomic.Bool
	syncing := make(chan struct{}, 1)
	release := make(chan struct{})
	var released sync.Once
	unhold := func() { hold.Store(false); released.Do(func() { close(release) }) }
	defer unhold() // before b.Close, which waits for the store's writer
	fs.SetInjector(func(op store.Op, _ string) error {
		if op == store.OpSync && hold.Load() {
			select {
			case syncing <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})

	sink := make(frameSink, 16)
	s := b.Open(sink, "publisher")
	defer s.Close()
	hold.Store(true)
	s.Handle(confirmedPublish(7, "a.b"))
	testutil.Recv(t, syncing, 10*time.Second) // the store waits in fsync
	select {
	case f := <-sink:
		t.Fatalf("%s Ref %d before the message was fsynced", f.Type, f.Ref)
	default:
	}

	// Routed to no durable subscription: nothing to wait for.
	s.Handle(confirmedPublish(8, "x.y"))
	select {
	case f := <-sink:
		if f.Type != wire.TypeOK || f.Ref != 8 {
			t.Fatalf("publish to nobody answered %s Ref %d, want OK Ref 8", f.Type, f.Ref)
		}
	default:
		t.Fatal("a confirmed publish routed to no durable subscription was not answered at once")
	}

	unhold()
	if f := testutil.Recv(t, (<-chan *wire.Frame)(sink), 10*time.Second); f.Type != wire.TypeOK || f.Ref != 7 {
		t.Fatalf("after the fsync: %s Ref %d (%s), want OK Ref 7", f.Type, f.Ref, f.Tag)
	}

	b2 := openDurable(t, fs.Crash(nil))
	defer b2.Close()
	for name, want := range map[string]int64{"events/all": 1, "events/ab": 1} {
		if got := b2.Queue(name).Stats().Messages(); got != want {
			t.Errorf("%s after the crash: %d messages, want %d", name, got, want)
		}
	}
}

// TestPublishConfirmStoreFailure: when the store fails to make a
// confirmed publish durable, the publisher gets ERROR code 30 rather
// than OK.
func TestPublishConfirmStoreFailure(t *testing.T) {
	fs := store.NewMemFS()
	b := openDurable(t, fs)
	defer b.Close()
	fs.SetInjector(func(op store.Op, _ string) error {
		if op == store.OpSync {
			return errors.New("disk on fire")
		}
		return nil
	})
	sink := make(frameSink, 16)
	s := b.Open(sink, "publisher")
	defer s.Close()
	s.Handle(confirmedPublish(9, "a.b"))
	f := testutil.Recv(t, (<-chan *wire.Frame)(sink), 10*time.Second)
	if f.Type != wire.TypeError || f.Ref != 9 || wire.Code(f.Aux) != wire.CodeStorage {
		t.Fatalf("got %s Ref %d code %d (%s), want ERROR Ref 9 code %d", f.Type, f.Ref, f.Aux, f.Tag, wire.CodeStorage)
	}
	t.Logf("the error: %s", f.Tag)
}

// countSink counts the OK frames delivered to it, from any goroutine.
type countSink struct{ ok, other atomic.Int64 }

func (c *countSink) Deliver(f *wire.Frame) {
	if f.Type == wire.TypeOK {
		c.ok.Add(1)
	} else {
		c.other.Add(1)
	}
	f.Release()
}

// BenchmarkPublishDurable measures the broker routing one publication
// into two durable subscriptions (a store on a MemFS): without a confirm,
// the path of a plain PUBLISH, and with one, pipelined, answered once the
// group commit has made it durable in both.
func BenchmarkPublishDurable(b *testing.B) {
	for _, confirm := range []bool{false, true} {
		name := "unconfirmed"
		if confirm {
			name = "confirmed"
		}
		b.Run(name, func(b *testing.B) {
			br := openDurable(b, store.NewMemFS())
			defer br.Close()
			sink := &countSink{}
			pub := br.Open(sink, "publisher")
			body := make([]byte, 128)
			b.ReportAllocs()
			n := int64(0)
			for b.Loop() {
				n++
				f := wire.NewFrame(wire.TypePublish)
				f.Name, f.Key, f.Body = "events", "a.b", body
				if confirm {
					f.Ref, f.Flags = uint64(n), wire.FlagReply
				}
				pub.Handle(f)
			}
			if confirm && !testutil.Eventually(time.Minute, func() bool { return sink.ok.Load() == n }) {
				b.Fatalf("%d confirms of %d", sink.ok.Load(), n)
			}
			if k := sink.other.Load(); k > 0 {
				b.Fatalf("%d frames other than OK", k)
			}
		})
	}
}
