package broker

import (
	"encoding/json"
	"io"
	"log/slog"
	"testing"

	"github.com/courier-mq/courier/wire"
)

type dropSink struct{}

func (dropSink) Deliver(f *wire.Frame) { f.Release() }

// TestAttachRacingCloseLeavesNoMember: an embedded client may close its
// session while another of its goroutines attaches a handler. When Close
// runs after the ATTACH registered the attachment but before it joined the
// group, the closed session must not stay a member: a member whose sink
// drops everything would take requests (and lead) forever.
func TestAttachRacingCloseLeavesNoMember(t *testing.T) {
	b := New(Config{Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer b.Close()
	cfg, _ := json.Marshal(wire.ExchangeConfig{Pattern: wire.PatternReqResp, Strategy: RoundRobin})
	admin := b.Open(dropSink{}, "admin")
	admin.Handle(&wire.Frame{Type: wire.TypeDeclare, Ref: 1, Name: "race", Body: cfg})
	ex := b.Exchange("race")

	s := b.Open(dropSink{}, "h")
	testHookBeforeJoin = func(*Attachment) { s.Close() }
	defer func() { testHookBeforeJoin = nil }()
	s.Handle(&wire.Frame{Type: wire.TypeAttach, Ref: 1, Attach: 1, Name: "race", Aux: wire.RoleHandler})
	if m := ex.Info().Members; len(m) != 0 {
		t.Fatalf("closed session still a member: %+v", m)
	}
}
