package node

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/courier-mq/courier/internal/cluster/meta"
	"github.com/courier-mq/courier/wire"
)

// TestRetryUnknown: an outcome the metadata group could not tell is
// tried again, a bounded number of times; anything else is returned as
// it is, and an ended context stops the attempts.
func TestRetryUnknown(t *testing.T) {
	unknown := fmt.Errorf("%w: leadership lost while committing log", meta.ErrNoQuorum)
	other := errors.New("clash")
	for _, tc := range []struct {
		name     string
		results  []error
		cancel   bool
		want     error
		attempts int
	}{
		{"settled on the second attempt", []error{unknown, nil}, false, nil, 2},
		{"another error at once", []error{other}, false, other, 1},
		{"never settled", []error{unknown, unknown, unknown, unknown}, false, meta.ErrNoQuorum, unknownAttempts},
		{"context ended", []error{unknown, nil}, true, meta.ErrNoQuorum, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				cancel()
			}
			n := 0
			var agains []bool
			err := retryUnknown(ctx, func(again bool) error {
				agains = append(agains, again)
				n++
				return tc.results[n-1]
			})
			if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("err %v, want %v", err, tc.want)
			}
			if n != tc.attempts {
				t.Errorf("%d attempts, want %d", n, tc.attempts)
			}
			for i, a := range agains {
				if a != (i > 0) {
					t.Errorf("attempt %d told again=%v", i, a)
				}
			}
		})
	}
}

// TestDeletedAfterUnknown: a delete that finds the exchange gone on a
// second attempt was applied by the first; on a first attempt it is the
// caller's error.
func TestDeletedAfterUnknown(t *testing.T) {
	notFound := wire.Errorf(wire.CodeNotFound, "exchange %q not found", "x")
	if err := deleted(true, notFound); err != nil {
		t.Errorf("second attempt, not found: %v, want nil", err)
	}
	if err := deleted(false, notFound); err != notFound {
		t.Errorf("first attempt, not found: %v, want it returned", err)
	}
	other := wire.Errorf(wire.CodeClash, "no")
	if err := deleted(true, other); err != other {
		t.Errorf("second attempt, another error: %v, want it returned", err)
	}
}
