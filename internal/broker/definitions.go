package broker

import (
	"cmp"
	"slices"

	"github.com/courier-mq/courier/wire"
)

// Definitions: what an operator backs up, migrates and reviews of a
// broker's shape, as RabbitMQ's definitions file has it (see
// internal/admin's /api/definitions). The broker lists its exchanges,
// queues and durable subscriptions, and checks an entry to import exactly
// as a DECLARE or an ATTACH would before anything is applied.

// ExchangeDef is an exchange's definition: its name and configuration, as
// DECLARE takes them.
type ExchangeDef struct {
	Name string `json:"name"`
	wire.ExchangeConfig
}

// QueueDef describes a task exchange's queue: its configuration is the
// exchange's.
type QueueDef struct {
	Name     string `json:"name"`
	Exchange string `json:"exchange"`
	Durable  bool   `json:"durable"`
}

// SubscriptionDef is a durable subscription: its pub-sub exchange, its
// name there, and the patterns its queue is bound with. Queue, the
// queue's name (exchange/name), is informative.
type SubscriptionDef struct {
	Exchange string   `json:"exchange"`
	Name     string   `json:"name"`
	Queue    string   `json:"queue,omitempty"`
	Patterns []string `json:"patterns"`
	// Headers are its header filters (an AMQP headers binding), if any.
	Headers []HeaderFilter `json:"headers,omitempty"`
}

// Definitions lists the broker's exchanges, task queues and durable
// subscriptions, each sorted by name. An exchange routed by a Go function
// is left out: its function cannot be written down, and the program that
// routes with it declares it.
func (b *Broker) Definitions() ([]ExchangeDef, []QueueDef, []SubscriptionDef) {
	exs := []ExchangeDef{}
	b.exchanges.Range(func(_, v any) bool {
		if ex := v.(*Exchange); ex.keyFn == nil && ex.route == nil {
			exs = append(exs, ExchangeDef{Name: ex.name, ExchangeConfig: ex.cfg})
		}
		return true
	})
	qs, subs := []QueueDef{}, []SubscriptionDef{}
	b.queues.Range(func(_, v any) bool {
		tq := v.(*taskQueue)
		tq.defMu.Lock()
		def := tq.def
		tq.defMu.Unlock()
		if def.Sub == "" {
			qs = append(qs, QueueDef{Name: def.Name, Exchange: def.Exchange, Durable: !def.Config.Transient})
		} else {
			subs = append(subs, SubscriptionDef{Exchange: def.Exchange, Name: def.Sub, Queue: def.Name, Patterns: slices.Clone(def.Patterns), Headers: slices.Clone(def.Headers)})
		}
		return true
	})
	slices.SortFunc(exs, func(a, b ExchangeDef) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(qs, func(a, b QueueDef) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(subs, func(a, b SubscriptionDef) int { return cmp.Compare(a.Queue, b.Queue) })
	return exs, qs, subs
}

// CheckDeclare checks a declaration as [Broker.DeclareAs] would, without
// making anything: its name, its numbers, its pattern, strategy,
// expressions (compiled) and options, and against the exchange of that
// name if there is one.
func (b *Broker) CheckDeclare(name string, spec Spec) error {
	if !ValidName(name) {
		return wire.Errorf(wire.CodeBadOptions, "invalid exchange name %q: use dot-separated words of letters, digits, '_', '-', ':'", name)
	}
	if err := spec.ExchangeConfig.Check(); err != nil {
		return wire.Errorf(wire.CodeBadOptions, "exchange %q: %v", name, err)
	}
	if ex := b.Exchange(name); ex != nil {
		return ex.matches(spec)
	}
	_, err := newExchange(b, name, spec)
	return err
}

// CheckSubscription checks a durable subscription sub to the exchange
// configured as cfg, with patterns, as an ATTACH would.
func (b *Broker) CheckSubscription(exchange string, cfg wire.ExchangeConfig, sub string, patterns []string) error {
	switch {
	case cfg.Pattern != wire.PatternPubSub:
		return wire.Errorf(wire.CodeNotAllowed, "durable subscription %q: exchange %q is not pub-sub", sub, exchange)
	case cfg.Controlled:
		return wire.Errorf(wire.CodeNotAllowed, "exchange %q is controlled: durable subscriptions need an exchange without a controller", exchange)
	case !ValidName(sub):
		return wire.Errorf(wire.CodeBadOptions, "invalid durable subscription name %q: use dot-separated words of letters, digits, '_', '-', ':'", sub)
	}
	if err := checkPatterns(patterns); err != nil {
		return wire.Errorf(wire.CodeBadOptions, "durable subscription %q: %v", sub, err)
	}
	return b.checkPatternCount(patterns)
}

// DurableSubscribe creates the durable subscription sub of the pub-sub
// exchange, or finds it, and binds it to patterns (none: its patterns
// stay as they are). Its queue takes the messages published to the
// exchange with a key that matches, whether a subscriber is attached or
// not.
func (b *Broker) DurableSubscribe(exchange, sub string, patterns []string) error {
	ex, err := b.lookup(exchange)
	if err != nil {
		return err
	}
	if err := b.CheckSubscription(exchange, ex.cfg, sub, patterns); err != nil {
		return err
	}
	_, err = b.durableSub(ex, sub, patterns, nil)
	return err
}
