package wire

// Clash checks a declaration of the exchange name, with the options
// want, against the options c it was created with: fields want leaves
// empty match anything, and the first field that differs is returned as
// a [CodeClash] error naming it. Task options are compared only when c
// is a task exchange's. The broker of every node and the cluster's
// metadata group judge declarations with it, so that both say the same.
func (c ExchangeConfig) Clash(name string, want ExchangeConfig) error {
	clash := func(what string, have, wanted any) error {
		if s, ok := have.(string); ok {
			return Errorf(CodeClash, "exchange %q exists with %s %q, not %q", name, what, s, wanted)
		}
		return Errorf(CodeClash, "exchange %q exists with %s %v, not %v", name, what, have, wanted)
	}
	switch {
	case want.Pattern != "" && want.Pattern != c.Pattern:
		return clash("pattern", c.Pattern, want.Pattern)
	case want.Strategy != "" && want.Strategy != c.Strategy:
		return clash("strategy", c.Strategy, want.Strategy)
	case want.KeyExpr != "" && want.KeyExpr != c.KeyExpr:
		return clash("key_expr", c.KeyExpr, want.KeyExpr)
	case want.RouteExpr != "" && want.RouteExpr != c.RouteExpr:
		return clash("route_expr", c.RouteExpr, want.RouteExpr)
	case want.Controlled && !c.Controlled:
		return clash("controlled", "false", "true")
	case want.Transient && !c.Transient:
		return clash("transient", "false", "true")
	case want.AMQPType != "" && c.AMQPType != "" && want.AMQPType != c.AMQPType:
		return clash("amqp_type", c.AMQPType, want.AMQPType)
	}
	if c.Pattern != PatternTasks {
		return nil
	}
	switch {
	case want.MaxAttempts != 0 && want.MaxAttempts != c.MaxAttempts:
		return clash("max_attempts", c.MaxAttempts, want.MaxAttempts)
	case want.TTLMS != 0 && want.TTLMS != c.TTLMS:
		return clash("ttl_ms", c.TTLMS, want.TTLMS)
	case want.BackoffMS != 0 && want.BackoffMS != c.BackoffMS:
		return clash("backoff_ms", c.BackoffMS, want.BackoffMS)
	case want.BackoffMaxMS != 0 && want.BackoffMaxMS != c.BackoffMaxMS:
		return clash("backoff_max_ms", c.BackoffMaxMS, want.BackoffMaxMS)
	case want.DeadLetter != "" && want.DeadLetter != c.DeadLetter:
		return clash("dead_letter", c.DeadLetter, want.DeadLetter)
	case want.MaxLength != 0 && want.MaxLength != c.MaxLength:
		return clash("max_length", c.MaxLength, want.MaxLength)
	case want.MaxBytes != 0 && want.MaxBytes != c.MaxBytes:
		return clash("max_bytes", c.MaxBytes, want.MaxBytes)
	case want.Overflow != "" && want.Overflow != c.Overflow:
		return clash("overflow", c.Overflow, want.Overflow)
	case want.DedupWindowMS != 0 && want.DedupWindowMS != c.DedupWindowMS:
		return clash("dedup_window_ms", c.DedupWindowMS, want.DedupWindowMS)
	case want.Replicas != 0 && want.Replicas != c.Replicas:
		return clash("replicas", c.Replicas, want.Replicas)
	}
	return nil
}
