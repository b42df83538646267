package courier

import (
	"testing"

	"github.com/courier-mq/courier/wire"
)

// A leader event's fencing token reaches the application's Event.
func TestEventCarriesFencingToken(t *testing.T) {
	var got Event
	a := &Attachment{member: "n2/c4.1", exchange: "svc", cfg: attachCfg{onEvent: func(e Event) { got = e }}}
	f := wire.NewFrame(wire.TypeEvent)
	f.Aux, f.Name = wire.EventLeader, "svc"
	f.Body = []byte(`{"leader":"n2/c4.1","members":[{"id":"n2/c4.1","role":"handler","node":"n2"}],"epoch":3,"term":7}`)
	a.event(f)
	if got.Kind != EventLeader || !got.IsLeader || got.Epoch != 3 || got.Term != 7 || got.Members[0].Node != "n2" {
		t.Fatalf("got %+v, want a leader event for this member with token 3/7 and its node", got)
	}
	if !a.IsLeader() {
		t.Error("IsLeader is false after the event naming it")
	}
}
