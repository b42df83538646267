package testutil

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestEventually(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			n.Add(1)
		}
	}()
	if !Eventually(5*time.Second, func() bool { return n.Load() == 3 }) {
		t.Fatal("Eventually gave up on a condition that became true")
	}
	if Eventually(10*time.Millisecond, func() bool { return false }) {
		t.Fatal("Eventually reported a condition that never held")
	}
}

func TestRecvAndClosed(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if v := Recv(t, ch, time.Second); v != 7 {
		t.Fatalf("Recv = %d, want 7", v)
	}
	done := make(chan struct{})
	close(done)
	Closed(t, done, time.Second, "done")
}
