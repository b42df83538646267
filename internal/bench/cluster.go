package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// ClusterCases are the cases of [CompareClusters], in order:
// request-response with the handler on another node than the
// requester, the same with both on one node, and pub-sub fan-out to
// subscribers spread over every node.
var ClusterCases = []string{"reqresp-cross", "reqresp-same", "fanout-spread"}

// ClusterConfig configures [CompareClusters].
type ClusterConfig struct {
	// Courier and NATS are the client URLs of each cluster's nodes, in
	// order: the requesters and the publisher connect to the first
	// (node A), the cross-node handler to the second (node B), and the
	// subscribers of fanout-spread round-robin to all. Either may be
	// empty to leave that cluster out.
	Courier, NATS []string
	// CourierHTTP are the management URLs of the Courier nodes: the
	// fan-out case reads their link counters over a few publications.
	CourierHTTP []string
	// Single, if set, is a single-node Courier server measured as the
	// baseline: every case with all its clients on that server.
	Single string
	// Cases are names from [ClusterCases]. Default: all of them.
	Cases []string
	// Rounds is how many times each case runs against each column, the
	// columns taking turns; the table shows the medians. Default: 1.
	Rounds int
	// Messages is the fan-out's message count. Default: 200 (each is
	// Config.Subscribers deliveries).
	Messages int
	// Config holds the settings shared by every run; Count is the
	// request-response cycles. Zero fields take the cluster defaults:
	// 20000 sequential cycles, Parallel 100 over 50000 cycles; fan-out:
	// 10000 subscribers and at most 20 warm-up messages.
	Config Config
	// Log, if set, receives a line as each run starts or a column is
	// skipped.
	Log func(line string)
}

// clusterColumn is one system measured by CompareClusters.
type clusterColumn struct {
	label string
	kind  Kind
	urls  []string // the single server: one
	http  []string
}

func (c clusterColumn) String() string {
	if len(c.urls) == 1 {
		return redact(c.urls[0])
	}
	r := make([]string, len(c.urls))
	for i, u := range c.urls {
		r[i] = redact(u)
	}
	return fmt.Sprintf("%d nodes: %s", len(c.urls), strings.Join(r, ", "))
}

// clusterCaseConfig returns the settings of one case on one column.
func clusterCaseConfig(name string, cc ClusterConfig, col clusterColumn) (Scenario, Config, error) {
	cfg := cc.Config
	cfg.ServerPID = 0
	t, err := ParseTarget(col.urls[0])
	if err != nil {
		return Scenario{}, cfg, err
	}
	cfg.Target = t
	var scenario string
	switch name {
	case "reqresp-cross", "reqresp-same":
		scenario = "reqresp"
		if cfg.Count > 0 {
			cfg.Counts = []int{cfg.Count}
			if cfg.ParallelCount == 0 {
				cfg.ParallelCount = cfg.Count
			}
		} else if len(cfg.Counts) == 0 && cfg.Duration == 0 {
			cfg.Counts = []int{20000}
		}
		if cfg.Parallel == nil {
			cfg.Parallel = []int{100}
		}
		if cfg.ParallelCount == 0 && cfg.Duration == 0 {
			cfg.ParallelCount = 50000
		}
		cfg.Count = 0
		if name == "reqresp-cross" && len(col.urls) > 1 {
			cfg.HandlerURL = col.urls[1]
		}
	case "fanout-spread":
		scenario = "pubsub"
		cfg.Publishers = 1
		if cfg.Subscribers == 0 {
			cfg.Subscribers = 10000
		}
		cfg.Count = cc.Messages
		if cfg.Count == 0 && cfg.Duration == 0 {
			cfg.Count = 200
		}
		if cfg.Warmup == 0 || cfg.Warmup > 20 {
			cfg.Warmup = 20 // each is Subscribers deliveries
		}
		if len(col.urls) > 1 {
			cfg.SubscriberURLs = col.urls
			cfg.NodesHTTP = col.http
		}
	default:
		return Scenario{}, cfg, fmt.Errorf("bench: cluster compare: unknown case %q (known: %s)", name, strings.Join(ClusterCases, ", "))
	}
	sc, _ := LookupScenario(scenario)
	return sc, cfg, nil
}

// CompareClusters runs each case against a Courier cluster, a NATS
// cluster and a single Courier server in turn, Rounds times, and
// tabulates the medians with the Courier cluster's ratio to the others
// (or, without a Courier cluster, the single server's). A column with a
// node that does not accept a TCP connection within two seconds is
// skipped with a line saying so. ctx bounds the whole comparison.
func CompareClusters(ctx context.Context, cc ClusterConfig) (*Comparison, error) {
	if len(cc.Cases) == 0 {
		cc.Cases = ClusterCases
	}
	cc.Rounds = max(cc.Rounds, 1)
	logf := func(format string, args ...any) {
		if cc.Log != nil {
			cc.Log(fmt.Sprintf(format, args...))
		}
	}
	var cols []clusterColumn
	if len(cc.Courier) > 0 {
		cols = append(cols, clusterColumn{label: "Courier cluster", kind: KindCourier, urls: cc.Courier, http: cc.CourierHTTP})
	}
	if len(cc.NATS) > 0 {
		cols = append(cols, clusterColumn{label: "NATS cluster", kind: KindNATS, urls: cc.NATS})
	}
	if cc.Single != "" {
		cols = append(cols, clusterColumn{label: "Courier single", kind: KindCourier, urls: []string{cc.Single}})
	}
	for _, col := range cols {
		for _, u := range col.urls {
			t, err := ParseTarget(u)
			if err != nil {
				return nil, err
			}
			if t.Kind != col.kind {
				return nil, fmt.Errorf("bench: cluster compare: %s is not a %s URL", redact(u), kindName(col.kind))
			}
		}
		for _, name := range cc.Cases {
			if _, _, err := clusterCaseConfig(name, cc, col); err != nil {
				return nil, err
			}
		}
	}
	cmp := &Comparison{vsAll: true}
	var live []clusterColumn
	for _, col := range cols {
		if err := col.reachable(ctx); err != nil {
			line := fmt.Sprintf("Skipping %s (%s): not reachable (%v)", col.label, col, err)
			logf("%s", line)
			cmp.Skipped = append(cmp.Skipped, line)
			continue
		}
		live = append(live, col)
		cmp.Targets = append(cmp.Targets, col.String())
		cmp.Kinds = append(cmp.Kinds, col.kind)
		cmp.Labels = append(cmp.Labels, col.label)
	}
	if len(live) == 0 {
		return cmp, fmt.Errorf("bench: cluster compare: no column reachable")
	}
	all := map[string][][]float64{} // case + metric -> by column, by round
	index := map[string]int{}
	for round := range cc.Rounds {
		for _, name := range cc.Cases {
			for ci, col := range live {
				sc, cfg, _ := clusterCaseConfig(name, cc, col)
				logf("Round %d: %s against %s (%s)", round+1, name, col.label, col)
				res, err := sc.Run(ctx, cfg)
				if err != nil {
					cmp.Errors = append(cmp.Errors, fmt.Sprintf("round %d, %s on %s: %v", round+1, name, col.label, err))
					logf("  failed: %v", err)
				}
				if res == nil || err != nil {
					continue
				}
				if ps, ok := res.(*PubSubResult); ok && ps.Links != nil {
					cmp.Notes = append(cmp.Notes, fmt.Sprintf("Round %d, %s on %s:", round+1, name, col.label))
					cmp.Notes = append(cmp.Notes, ps.Links.Lines()...)
				}
				for _, m := range res.Metrics() {
					key := name + "\x00" + m.Name
					if _, ok := index[key]; !ok {
						index[key] = len(cmp.Rows)
						cmp.Rows = append(cmp.Rows, Row{Case: name, Metric: m.Name, Unit: m.Unit, Lower: m.Lower})
						all[key] = make([][]float64, len(live))
					}
					all[key][ci] = append(all[key][ci], m.Value)
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
	}
	for key, i := range index {
		r := &cmp.Rows[i]
		r.Values = make([]jsonFloat, len(live))
		r.Range = make([][2]jsonFloat, len(live))
		for ci, vs := range all[key] {
			r.Values[ci] = jsonFloat(median(vs))
			lo, hi := math.NaN(), math.NaN()
			if len(vs) > 0 {
				lo, hi = slices.Min(vs), slices.Max(vs)
			}
			r.Range[ci] = [2]jsonFloat{jsonFloat(lo), jsonFloat(hi)}
			if len(vs) > r.Rounds {
				r.Rounds = len(vs)
			}
		}
	}
	if cc.Rounds > 1 {
		cmp.Notes = append([]string{fmt.Sprintf("Medians of %d rounds, the columns taking turns; [min–max] beside them.", cc.Rounds)}, cmp.Notes...)
	}
	return cmp, ctx.Err()
}

// median returns the median of vs; NaN for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}

// reachable checks that every server of the column accepts TCP
// connections.
func (c clusterColumn) reachable(ctx context.Context) error {
	for _, u := range c.urls {
		t, err := ParseTarget(u)
		if err != nil {
			return err
		}
		if err := t.reachable(ctx); err != nil {
			return fmt.Errorf("%s: %w", redact(u), err)
		}
	}
	return nil
}

// ClusterTimeout is the default bound on a cluster comparison: fan-out
// to 10,000 subscribers connects 10,000 clients per column and round.
const ClusterTimeout = 30 * time.Minute
