package courier

import (
	"encoding/json"
	"fmt"

	"github.com/courier-mq/courier/wire"
)

// SubscriptionRequest is a subscription waiting for a controller.
type SubscriptionRequest struct {
	// Member is the attachment that wants to subscribe.
	Member Member
	// Patterns are the patterns it asked for.
	Patterns []string
}

// Decision is a controller's answer to a [SubscriptionRequest].
type Decision struct {
	// Refuse, if not empty, refuses the subscription with this reason.
	Refuse string
	// Patterns, if not nil, narrows the subscription to these patterns.
	Patterns []string
}

// Accept accepts a subscription as asked.
func Accept() Decision { return Decision{} }

// Refuse refuses a subscription with a reason the subscriber sees.
func Refuse(reason string) Decision { return Decision{Refuse: reason} }

// Narrow accepts a subscription but only to patterns.
func Narrow(patterns ...string) Decision { return Decision{Patterns: patterns} }

// ControlFunc decides on a subscription to a controlled exchange. It runs
// on the controller attachment's goroutine, one request at a time.
type ControlFunc func(req *SubscriptionRequest) Decision

func (a *Attachment) decide(f *wire.Frame) {
	defer f.Release()
	var body wire.SubRequestBody
	d := Refuse("the controller could not read the request")
	sess := a.c.sess.Load()
	if err := json.Unmarshal(f.Body, &body); err == nil {
		d = a.runControl(&SubscriptionRequest{Member: body.Member, Patterns: body.Patterns})
	}
	if sess != a.c.sess.Load() {
		return // asked on a connection lost since: nobody waits for it
	}
	out := wire.NewFrame(wire.TypeDecision)
	out.Ref, out.Attach = f.Ref, a.id
	if d.Refuse != "" {
		out.Aux, out.Tag = wire.VerdictRefuse, d.Refuse
	} else if d.Patterns != nil {
		out.Body, _ = json.Marshal(wire.PatternsBody{Patterns: d.Patterns})
	}
	a.c.send(out)
}

func (a *Attachment) runControl(req *SubscriptionRequest) (d Decision) {
	defer func() {
		if p := recover(); p != nil {
			a.c.log.Error("courier: controller panicked", "attachment", a.ID(), "panic", p)
			d = Refuse(fmt.Sprintf("the controller failed: %v", p))
		}
	}()
	if a.control == nil {
		return Accept()
	}
	return a.control(req)
}
