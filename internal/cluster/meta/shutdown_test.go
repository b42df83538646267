package meta

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestShutdownWithBarriersQueued: barriers still in Raft's batched apply
// queue when the node shuts down are never answered by Raft
// (hashicorp/raft#498); the node's own waits on them end at shutdown,
// so Shutdown, which waits for the node's goroutines, returns. A -race
// run of the package once hung here for ten minutes in startTerm.
func TestShutdownWithBarriersQueued(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint(round), func(t *testing.T) { shutdownWithBarriers(t) })
	}
}

func shutdownWithBarriers(t *testing.T) {
	{
		c := newCluster(t, 3, nil)
		m := c.waitLeader(30 * time.Second)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if m.barrier(time.Second) != nil {
						return
					}
				}
			}()
		}
		time.Sleep(20 * time.Millisecond) // let barriers queue up
		done := make(chan struct{})
		go func() {
			m.Shutdown()
			close(stop)
			wg.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatal("Shutdown or a barrier still waiting 60 s after shutdown began")
		}
	}
}
