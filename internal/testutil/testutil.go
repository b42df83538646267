// Package testutil holds small helpers shared by Courier's tests: polling
// for a condition instead of sleeping, contexts bound to a test, and
// receiving from channels with a deadline.
//
// It is imported only from _test.go files and from test suites such as
// internal/behaviour; it never sleeps to wait for correctness.
package testutil

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// pollInterval is how often WaitFor checks its condition.
const pollInterval = 2 * time.Millisecond

// WaitFor polls cond until it returns true, and fails the test if it has
// not within timeout. cond runs on the calling goroutine.
func WaitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("condition not met within %v", timeout)
	}
}

// WaitForf is [WaitFor] with a message that says what was awaited.
func WaitForf(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Eventually(timeout, cond) {
		t.Fatalf("not met within %v: %s", timeout, fmt.Sprintf(format, args...))
	}
}

// Eventually polls cond until it returns true or timeout passes, and
// reports whether it did. It is for helpers that fail in their own words.
func Eventually(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		<-tick.C
	}
}

// Context returns a context that ends after timeout or when the test ends,
// whichever comes first.
func Context(t testing.TB, timeout time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Recv receives one value from ch, failing the test if none comes within
// timeout or ch is closed.
func Recv[T any](t testing.TB, ch <-chan T, timeout time.Duration) T {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("channel closed while waiting for a %T", v)
		}
		return v
	case <-timer.C:
		var zero T
		t.Fatalf("no %T received within %v", zero, timeout)
		return zero
	}
}

// Closed waits until ch is closed (or yields a value), failing the test if
// it does not within timeout. what names ch in the failure.
func Closed[T any](t testing.TB, ch <-chan T, timeout time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("%s not done within %v", what, timeout)
	}
}
