package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// CompareCases are the cases courier-bench compare knows, in order:
// request-response, pub-sub fan-out, pub-sub fan-in, many users, durable
// tasks, backlog.
var CompareCases = []string{"reqresp", "fanout", "fanin", "users", "tasks", "backlog"}

// CompareConfig configures [Compare].
type CompareConfig struct {
	// Targets are measured one after another. The ratios are about the
	// first Courier server among them (else the first target), against
	// every target that is not Courier. An AMQP target is headed by the
	// product its server announces: RabbitMQ, or Courier AMQP for
	// Courier's AMQP port.
	Targets []Target
	// Cases are names from [CompareCases]. Default: reqresp, fanout,
	// fanin.
	Cases []string
	// Config holds the settings shared by every run: Size, Count,
	// Duration, Rate, Queue (Depth for backlog); ServerPID is ignored.
	// Zero fields take the case's compare default, smaller than the
	// scenarios' own so that a comparison takes minutes, not hours:
	// 100000 tasks, a backlog 200000 deep.
	Config Config
	// Log, if set, receives a line as each run starts or a target is
	// skipped.
	Log func(line string)
}

// caseConfig returns the settings of one case of a comparison.
func caseConfig(name string, base Config) (Scenario, Config, error) {
	cfg := base
	cfg.ServerPID = 0
	var scenario string
	switch name {
	case "reqresp":
		scenario = "reqresp"
		if cfg.Count > 0 {
			cfg.Counts, cfg.ParallelCount = []int{cfg.Count}, cfg.Count
		} else if len(cfg.Counts) == 0 && cfg.Duration == 0 {
			cfg.Counts = []int{20000}
		}
		if cfg.Parallel == nil {
			cfg.Parallel = []int{10, 100}
		}
		if cfg.ParallelCount == 0 && cfg.Duration == 0 {
			cfg.ParallelCount = 50000
		}
		cfg.Count = 0
	case "fanout", "fanin":
		scenario = "pubsub"
		cfg.Publishers, cfg.Subscribers = 1, 10
		if name == "fanin" {
			cfg.Publishers, cfg.Subscribers = 10, 1
		}
		if cfg.Count == 0 && cfg.Duration == 0 {
			cfg.Count = 100000
		}
	case "users":
		scenario = "users"
		if cfg.Users.Users == 0 {
			cfg.Users.Users = 100
		}
		if cfg.Users.Ramp == 0 {
			cfg.Users.Ramp = 100
		}
		if cfg.Duration == 0 {
			cfg.Duration = 10 * time.Second
		}
	case "tasks":
		scenario = "tasks"
		if cfg.Count == 0 && cfg.Duration == 0 {
			cfg.Count = 100000
		}
	case "backlog":
		scenario = "backlog"
		if cfg.Queue.Depth == 0 {
			cfg.Queue.Depth = 200000
		}
		if cfg.Queue.SampleEvery == 0 {
			cfg.Queue.SampleEvery = cfg.Queue.Depth / 4
		}
	default:
		return Scenario{}, cfg, fmt.Errorf("bench: compare: unknown case %q (known: %s)", name, strings.Join(CompareCases, ", "))
	}
	sc, _ := LookupScenario(scenario)
	return sc, cfg, nil
}

// Comparison is the outcome of [Compare]: one row per figure, one
// column per target that was reachable.
type Comparison struct {
	Targets []string `json:"targets"`
	Kinds   []Kind   `json:"kinds"`
	Rows    []Row    `json:"rows"`
	// Skipped says which targets were left out, and why.
	Skipped []string `json:"skipped,omitempty"`
	// Errors lists the runs that failed.
	Errors []string `json:"errors,omitempty"`
	// Labels, if set, head the columns instead of the kinds' names.
	Labels []string `json:"labels,omitempty"`
	// Notes are printed after the table, such as link counters.
	Notes []string `json:"notes,omitempty"`
	// vsAll: the ratios are of the first column to every other one
	// (a cluster comparison), whatever their kinds.
	vsAll bool
}

// heading is column i's heading.
func (c *Comparison) heading(i int) string {
	if i < len(c.Labels) {
		return c.Labels[i]
	}
	return kindName(c.Kinds[i])
}

// Row is one figure of a comparison across the targets.
type Row struct {
	Case   string `json:"case"`
	Metric string `json:"metric"`
	Unit   string `json:"unit"`
	Lower  bool   `json:"lower_is_better,omitempty"`
	// Values are by target, NaN (null in JSON) where a target has none.
	// With several rounds ([CompareClusters]), they are the medians.
	Values []jsonFloat `json:"values"`
	// Range is the lowest and highest value by target, and Rounds how
	// many rounds counted, when there were several.
	Range  [][2]jsonFloat `json:"range,omitempty"`
	Rounds int            `json:"rounds,omitempty"`
}

// cell formats column i's value, with its range over several rounds.
func (r Row) cell(i int) string {
	v := formatFigure(float64(r.Values[i]))
	if r.Rounds > 1 && i < len(r.Range) && !math.IsNaN(float64(r.Range[i][0])) {
		v += fmt.Sprintf(" [%s–%s]", formatFigure(float64(r.Range[i][0])), formatFigure(float64(r.Range[i][1])))
	}
	return v
}

// jsonFloat is a float64 that encodes NaN as null.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(f)) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(f), 'g', -1, 64), nil
}

// Compare runs each case against each target in turn and gathers their
// figures. A network target that does not accept a TCP connection within
// two seconds is skipped with a line saying so; a run that fails leaves
// its column empty for that case. ctx bounds the whole comparison.
func Compare(ctx context.Context, cc CompareConfig) (*Comparison, error) {
	if len(cc.Cases) == 0 {
		cc.Cases = []string{"reqresp", "fanout", "fanin"}
	}
	logf := func(format string, args ...any) {
		if cc.Log != nil {
			cc.Log(fmt.Sprintf(format, args...))
		}
	}
	for _, name := range cc.Cases {
		if _, _, err := caseConfig(name, cc.Config); err != nil {
			return nil, err
		}
	}
	cmp := &Comparison{}
	var targets []Target
	for _, t := range cc.Targets {
		if err := t.reachable(ctx); err != nil {
			line := fmt.Sprintf("Skipping %s: not reachable (%v)", t, err)
			logf("%s", line)
			cmp.Skipped = append(cmp.Skipped, line)
			continue
		}
		targets = append(targets, t)
		cmp.Targets = append(cmp.Targets, t.String())
		cmp.Kinds = append(cmp.Kinds, t.Kind)
		label := kindName(t.Kind)
		if t.Kind == KindAMQP {
			label = amqpLabel(t.URL)
		}
		cmp.Labels = append(cmp.Labels, label)
	}
	if len(targets) == 0 {
		return cmp, fmt.Errorf("bench: compare: no target reachable")
	}
	index := map[string]int{} // case + metric -> row
	for _, name := range cc.Cases {
		for ti, t := range targets {
			sc, cfg, _ := caseConfig(name, cc.Config)
			if !sc.Supports(t.Kind) {
				logf("Skipping %s on %s: no mapping", name, t)
				continue
			}
			cfg.Target = t
			logf("Running %s against %s", name, t)
			res, err := sc.Run(ctx, cfg)
			if err != nil {
				cmp.Errors = append(cmp.Errors, fmt.Sprintf("%s on %s: %v", name, t, err))
				logf("  failed: %v", err)
			}
			if res == nil || err != nil {
				continue
			}
			for _, m := range res.Metrics() {
				key := name + "\x00" + m.Name
				i, ok := index[key]
				if !ok {
					i = len(cmp.Rows)
					index[key] = i
					vals := make([]jsonFloat, len(targets))
					for j := range vals {
						vals[j] = jsonFloat(math.NaN())
					}
					cmp.Rows = append(cmp.Rows, Row{Case: name, Metric: m.Name, Unit: m.Unit, Lower: m.Lower, Values: vals})
				}
				cmp.Rows[i].Values[ti] = jsonFloat(m.Value)
			}
		}
	}
	return cmp, ctx.Err()
}

// reachable checks that a network target accepts TCP connections.
func (t Target) reachable(ctx context.Context) error {
	if t.URL == "" {
		return nil
	}
	u, err := url.Parse(t.URL)
	if err != nil {
		return err
	}
	port, err := t.port()
	if err != nil {
		return err
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return c.Close()
}

// ratio is how many times better the first value is than other: a over
// b where higher is better, b over a where lower is.
func ratio(first, other float64, lower bool) float64 {
	if lower {
		first, other = other, first
	}
	if other == 0 || math.IsNaN(first) || math.IsNaN(other) {
		return math.NaN()
	}
	return first / other
}

// reference returns the column the ratios are about, and the columns
// they compare it with.
func (c *Comparison) reference() (int, []int) {
	if c.vsAll {
		ref := max(slices.Index(c.Kinds, KindCourier), 0)
		var others []int
		for i := range c.Kinds {
			if i != ref {
				others = append(others, i)
			}
		}
		return ref, others
	}
	ref := 0
	for i, k := range c.Kinds {
		if k == KindCourier {
			ref = i
			break
		}
	}
	var others []int
	for i, k := range c.Kinds {
		if i != ref && k != KindCourier && k != KindEmbedded {
			others = append(others, i)
		}
	}
	return ref, others
}

// WriteText prints one table: a row per figure, a column per target,
// then the Courier server's ratio to each other broker.
func (c *Comparison) WriteText(w io.Writer) error {
	var b strings.Builder
	for _, s := range c.Skipped {
		b.WriteString(s + "\n")
	}
	ref, others := c.reference()
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "case\tfigure\tunit\t")
	for i := range c.Kinds {
		fmt.Fprintf(tw, "%s\t", c.heading(i))
	}
	for _, o := range others {
		fmt.Fprintf(tw, "%s/%s\t", c.heading(ref), c.heading(o))
	}
	fmt.Fprint(tw, "\n")
	for _, r := range c.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t", r.Case, r.Metric, r.Unit)
		for i := range r.Values {
			fmt.Fprintf(tw, "%s\t", r.cell(i))
		}
		for _, o := range others {
			q := ratio(float64(r.Values[ref]), float64(r.Values[o]), r.Lower)
			if math.IsNaN(q) {
				fmt.Fprint(tw, "–\t")
			} else {
				fmt.Fprintf(tw, "%.2fx\t", q)
			}
		}
		fmt.Fprint(tw, "\n")
	}
	tw.Flush()
	for i, t := range c.Targets {
		fmt.Fprintf(&b, "%s: %s\n", c.heading(i), t)
	}
	if len(others) > 0 {
		who := c.Targets[ref]
		if len(c.Labels) > ref {
			who = c.Labels[ref]
		}
		fmt.Fprintf(&b, "Ratios: how many times better %s did (above 1: better); rates are divided, latency, CPU and memory inverted.\n", who)
	}
	for _, n := range c.Notes {
		b.WriteString(n + "\n")
	}
	for _, e := range c.Errors {
		b.WriteString("Failed: " + e + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// kindName is a column heading.
func kindName(k Kind) string {
	switch k {
	case KindEmbedded:
		return "Courier embedded"
	case KindCourier:
		return "Courier server"
	case KindNATS:
		return "NATS"
	case KindAMQP:
		return "RabbitMQ"
	case KindEcho:
		return "echo"
	}
	return string(k)
}

// WriteJSON prints the comparison as one JSON object.
func (c *Comparison) WriteJSON(w io.Writer) error { return writeJSON(w, c) }

func formatFigure(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case math.Abs(v) >= 100 || v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
