package server_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/courier-mq/courier"
	"github.com/courier-mq/courier/client"
	"github.com/courier-mq/courier/internal/testutil"
)

// TestBackpressureIsNotSilence: while a connection's read loop waits for a
// slow subscriber to make room (backpressure), the connection is not
// silent, and neither side may close it for a heartbeat timeout. The
// publisher keeps sending PINGs the server has not read yet; the
// subscriber's client has frames it has not taken yet, its read loop
// held by the application: it goes on sending PINGs, and it does not
// take the server for dead for it. (It did: the client closed its own
// connection, and the messages behind it were lost.)
func TestBackpressureIsNotSilence(t *testing.T) {
	// Generous: -race on two loaded cores (the whole suite runs its
	// packages at once) has delayed a PING by several hundred ms; 250 ms
	// (a 750 ms timeout) failed once in a full run.
	const hb = 400 * time.Millisecond
	n := startNode(t, hb)
	ctx := testutil.Context(t, 60*time.Second)
	for _, remoteSub := range []bool{false, true} {
		name := map[bool]string{false: "embedded subscriber", true: "remote subscriber"}[remoteSub]
		t.Run(name, func(t *testing.T) {
			sc := n.Connect()
			if remoteSub {
				var err error
				if sc, err = client.Dial(ctx, n.URL(), client.Options{Heartbeat: hb}); err != nil {
					t.Fatal(err)
				}
			}
			defer sc.Close()
			exName := map[bool]string{false: "bp.e", true: "bp.r"}[remoteSub]
			sx, err := sc.PubSub(ctx, exName)
			if err != nil {
				t.Fatal(err)
			}
			release := make(chan struct{})
			got := make(chan struct{}, 1)
			var delivered atomic.Int64
			if _, err := sx.Subscribe(ctx, "#", func(*courier.Delivery) {
				delivered.Add(1)
				select {
				case got <- struct{}{}:
				default:
				}
				<-release
			}); err != nil {
				t.Fatal(err)
			}
			pc, err := client.Dial(ctx, n.URL(), client.Options{Heartbeat: hb})
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			px, err := pc.PubSub(ctx, exName)
			if err != nil {
				t.Fatal(err)
			}
			body := make([]byte, 4096)
			published := make(chan error, 1)
			const total = 20000
			go func() {
				for range total { // more than the subscriber's inbox holds
					if err := px.Publish(ctx, "k", body); err != nil {
						published <- err
						return
					}
				}
				published <- nil
			}()
			<-got
			// Backpressure now holds a read loop. Many heartbeat timeouts
			// pass; both connections must stay open.
			select {
			case <-pc.Done():
				t.Fatalf("publisher closed while held by backpressure: %v", pc.Err())
			case <-sc.Done():
				t.Fatalf("subscriber closed while held by backpressure: %v", sc.Err())
			case <-time.After(8 * hb): // over two timeouts
			}
			close(release)
			if err := <-published; err != nil {
				t.Fatal(err)
			}
			if err := px.PublishSync(ctx, courier.Message{Key: "k"}); err != nil {
				t.Fatal(err)
			}
			// Nothing was lost: the subscriber's client, its read loop
			// held by the application, did not take the server for dead.
			testutil.WaitForf(t, 30*time.Second, func() bool { return delivered.Load() == total+1 },
				"the subscriber got %d of %d messages", delivered.Load(), total+1)
			select {
			case <-sc.Done():
				t.Fatalf("subscriber closed: %v", sc.Err())
			default:
			}
		})
	}
}
