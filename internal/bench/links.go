package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LinkReport is what the link counters of a Courier cluster's nodes did
// over a few publications: every numeric field of GET /api/nodes whose
// path [isLinkPath] takes for a node-to-node link's, read on every node
// before and after, next to the same fields over an equal window
// without publications (link heartbeats move some of them). Each node's
// own row is read (the one whose http_url is the URL read), as another
// node's row may show this node's view of it.
type LinkReport struct {
	// Publications is how many messages were published in the window.
	Publications int `json:"publications"`
	// Window is the length of each of the two windows, in seconds.
	Window float64 `json:"window_s"`
	// Counters are the link fields that moved in either window.
	Counters []LinkCounter `json:"counters"`
	// Found is how many link fields the nodes reported in all, moved
	// or not.
	Found int `json:"found"`
	// Notes say which nodes could not be read or had no link fields,
	// with the fields they do have.
	Notes []string `json:"notes,omitempty"`
}

// LinkCounter is one numeric field of a node's GET /api/nodes and how
// much it moved.
type LinkCounter struct {
	// Node is the management URL it was read from.
	Node string `json:"node"`
	// Path names the field in the document: node names and the names of
	// list entries (their "name", "node", "peer" or "id") in brackets,
	// such as "n1.cluster_links[n2].send_msgs".
	Path string `json:"path"`
	// Delta is its change over the publication's window, Idle over the
	// window without one.
	Delta float64 `json:"delta"`
	Idle  float64 `json:"idle"`
}

// isLinkPath reports whether a field of GET /api/nodes counts traffic
// on a node-to-node link. The field names of the cluster's links were
// not settled when this was written (the fabric's branch had
// "links":[{"peer":"n2","control":{"frames_out":...},"data":{...}}]):
// it takes any path with "link", "route" or "peer" in it (RabbitMQ's
// cluster_links, NATS's routes), but not round-trip times, latencies
// and timestamps. Adjust it here, and isCopyPath, once the names are
// known.
func isLinkPath(path string) bool {
	p := strings.ToLower(path)
	if !strings.Contains(p, "link") && !strings.Contains(p, "route") && !strings.Contains(p, "peer") {
		return false
	}
	// Not counters: round-trip times, latencies, timestamps.
	last := p[strings.LastIndexByte(p, '.')+1:]
	return !strings.Contains(last, "rtt") && !strings.Contains(last, "latency") && !strings.Contains(last, "since")
}

// isCopyPath reports whether a link field counts messages or frames
// sent: the fields whose moves over one publication are the copies that
// crossed the links. Control links (votes, views, heartbeats) are left
// out. Adjust it with isLinkPath.
func isCopyPath(path string) bool {
	p := strings.ToLower(path)
	if !isLinkPath(p) || strings.Contains(p, "control") {
		return false
	}
	for _, w := range []string{"frames_out", "msgs_out", "messages_out", "send_msgs", "sent_msgs", "sent_frames"} {
		if strings.Contains(p, w) {
			return true
		}
	}
	return false
}

// Copies sums, by sending node, the copies of one publication that
// crossed the links ([LinkReport.CopiesByLink]).
func (rep *LinkReport) Copies() map[string]float64 {
	out := map[string]float64{}
	for path, v := range rep.CopiesByLink() {
		node, _, _ := strings.Cut(path, ".")
		out[node] += v
	}
	return out
}

// CopiesByLink returns, for each sent-frame or sent-message field
// ([isCopyPath]), its move over the publications less the link's
// heartbeats, divided by the publications: the copies of one
// publication sent on that link. A field reported by several nodes is
// counted once.
//
// Heartbeats: Courier's node links are pairs, control and data, each
// sending a PING every heartbeat and a PONG for each it receives; with
// nothing else on the control link while subscriptions stand still, the
// control link's frames_out over the same window are the data link's
// heartbeats, to the frame. A field with such a sibling (".data." for
// ".control.") is corrected by the sibling's move; any other by its own
// move over the idle window, which may differ by a heartbeat or two.
func (rep *LinkReport) CopiesByLink() map[string]float64 {
	delta := map[string]float64{}
	for _, c := range rep.Counters {
		delta[c.Path] = c.Delta
	}
	out := map[string]float64{}
	for _, c := range rep.Counters {
		if !isCopyPath(c.Path) {
			continue
		}
		v := c.Delta - c.Idle
		if sibling := strings.Replace(c.Path, ".data.", ".control.", 1); sibling != c.Path {
			v = c.Delta - delta[sibling] // absent: it did not move at all
		}
		v /= float64(max(rep.Publications, 1))
		if old, ok := out[c.Path]; !ok || v > old {
			out[c.Path] = v
		}
	}
	return out
}

// maxNodesDoc bounds the GET /api/nodes document read from a node.
const maxNodesDoc = 16 << 20

// readNodes returns every numeric field of a node's GET /api/nodes, by
// path ([LinkCounter.Path]), and the name of the node's own row (""
// when no row's http_url is base). Credentials in the URL
// (http://user:password@host:port) are sent as basic authentication.
func readNodes(ctx context.Context, base string) (map[string]float64, string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, "", err
	}
	host := u.Host
	user := u.User
	u.User = nil
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/nodes"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, "", err
	}
	if user != nil {
		pw, _ := user.Password()
		req.SetBasicAuth(user.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxNodesDoc+1))
	if err != nil {
		return nil, "", err
	}
	if len(b) > maxNodesDoc {
		return nil, "", fmt.Errorf("GET %s: more than %d bytes", u.Redacted(), maxNodesDoc)
	}
	return parseNodes(b, host)
}

// parseNodes returns the numeric leaves of a GET /api/nodes document by
// path, and the name of the row whose http_url has the host (host:port)
// given.
func parseNodes(b []byte, host string) (map[string]float64, string, error) {
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, "", fmt.Errorf("GET /api/nodes: %w", err)
	}
	out := map[string]float64{}
	flatten(doc, "", 0, out)
	return out, selfRow(doc, host), nil
}

// flattenJSON returns the numeric leaves of a JSON document by path.
func flattenJSON(b []byte) (map[string]float64, error) {
	m, _, err := parseNodes(b, "")
	return m, err
}

// selfRow returns the name of the node whose http_url has host, "" if
// none has.
func selfRow(doc any, host string) string {
	rows, _ := doc.([]any)
	for _, r := range rows {
		m, ok := r.(map[string]any)
		if !ok {
			continue
		}
		raw, _ := m["http_url"].(string)
		name, _ := m["name"].(string)
		if u, err := url.Parse(raw); err == nil && host != "" && u.Host == host && name != "" {
			return name
		}
	}
	return ""
}

// maxFlattenDepth bounds the nesting flatten follows.
const maxFlattenDepth = 16

func flatten(v any, path string, depth int, out map[string]float64) {
	if depth > maxFlattenDepth {
		return
	}
	switch x := v.(type) {
	case float64:
		out[path] = x
	case map[string]any:
		for k, e := range x {
			flatten(e, joinPath(path, k), depth+1, out)
		}
	case []any:
		for i, e := range x {
			label := entryLabel(e, i)
			if path == "" {
				flatten(e, label, depth+1, out) // the nodes themselves
			} else {
				flatten(e, path+"["+label+"]", depth+1, out)
			}
		}
	}
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// entryLabel names a list entry by its "name", "node", "peer" or "id",
// else by its index.
func entryLabel(e any, i int) string {
	if m, ok := e.(map[string]any); ok {
		for _, k := range []string{"name", "node", "peer", "id"} {
			if s, ok := m[k].(string); ok && s != "" {
				return s
			}
		}
	}
	return strconv.Itoa(i)
}

// linkSnapshot is every node's numeric fields at one moment, by
// management URL; nil for a node that could not be read.
type linkSnapshot map[string]map[string]float64

// readAllNodes reads every node; selves gets each one's own row's name.
func readAllNodes(ctx context.Context, bases []string, errs map[string]error, selves map[string]string) linkSnapshot {
	s := linkSnapshot{}
	for _, b := range bases {
		m, self, err := readNodes(ctx, b)
		if err != nil {
			errs[b] = err
		}
		s[b] = m
		if self != "" {
			selves[b] = self
		}
	}
	return s
}

// measureLinks reads the nodes' link counters before and after publish
// sends n messages and waits for their deliveries (the window, at least
// window long), then again after an idle window of the same length.
func measureLinks(ctx context.Context, bases []string, window time.Duration, n int, publish func() error) (*LinkReport, error) {
	errs, selves := map[string]error{}, map[string]string{}
	s0 := readAllNodes(ctx, bases, errs, selves)
	start := time.Now()
	if err := publish(); err != nil {
		return nil, err
	}
	if rest := window - time.Since(start); rest > 0 {
		sleepCtx(ctx, rest)
	}
	elapsed := time.Since(start)
	s1 := readAllNodes(ctx, bases, errs, selves)
	sleepCtx(ctx, elapsed)
	s2 := readAllNodes(ctx, bases, errs, selves)
	rep := &LinkReport{Publications: n, Window: elapsed.Seconds()}
	for _, b := range bases {
		if err := errs[b]; err != nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %v", redact(b), err))
			continue
		}
		rep.add(redact(b), selves[b], s0[b], s1[b], s2[b])
	}
	return rep, ctx.Err()
}

// add adds the link fields of one node's own row (self; every row when
// "") that moved: over the publications from s0 to s1, idle from s1 to
// s2. It notes a node without link fields.
func (rep *LinkReport) add(node, self string, s0, s1, s2 map[string]float64) {
	var paths, all []string
	for p := range s2 {
		all = append(all, p)
		if isLinkPath(p) && (self == "" || strings.HasPrefix(p, self+".")) {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	rep.Found += len(paths)
	if len(paths) == 0 {
		slices.Sort(all)
		if len(all) > 12 {
			all = append(all[:12], "...")
		}
		rep.Notes = append(rep.Notes, fmt.Sprintf("%s: no link fields in /api/nodes (isLinkPath); it has %s", node, strings.Join(all, ", ")))
		return
	}
	for _, p := range paths {
		c := LinkCounter{Node: node, Path: p, Delta: s1[p] - s0[p], Idle: s2[p] - s1[p]}
		if c.Delta != 0 || c.Idle != 0 {
			rep.Counters = append(rep.Counters, c)
		}
	}
}

// Lines describe the report: the fields that moved beyond heartbeats
// (a data link's field otherwise than its control sibling, any other
// otherwise than when idle), then the copies per publication:
//
//	Link counters over 20 publications (GET /api/nodes, 0.5 s windows; 40 link fields, 2 moved beyond heartbeats):
//	  http://127.0.0.1:7481  n1.links[n2].data.frames_out  +22  (heartbeats +2, idle +2)
func (rep *LinkReport) Lines() []string {
	delta := map[string]float64{}
	for _, c := range rep.Counters {
		delta[c.Path] = c.Delta
	}
	// A data link's field moved beyond its heartbeats when it moved
	// otherwise than its control sibling; any other field, otherwise
	// than when idle.
	beyond := func(c LinkCounter) (float64, string) {
		if sibling := strings.Replace(c.Path, ".data.", ".control.", 1); sibling != c.Path {
			return c.Delta - delta[sibling], fmt.Sprintf("heartbeats %s, idle %s", signed(delta[sibling]), signed(c.Idle))
		}
		if strings.Contains(c.Path, ".control.") {
			data := strings.Replace(c.Path, ".control.", ".data.", 1)
			if _, ok := delta[data]; ok {
				return 0, "" // the heartbeats of its data sibling
			}
		}
		return c.Delta - c.Idle, "idle " + signed(c.Idle)
	}
	var moved []string
	for _, c := range rep.Counters {
		if v, note := beyond(c); v != 0 {
			moved = append(moved, fmt.Sprintf("  %s  %s  %s  (%s)", c.Node, c.Path, signed(c.Delta), note))
		}
	}
	out := []string{fmt.Sprintf("Link counters over %d publications (GET /api/nodes, %.1f s windows; %d link fields, %d moved beyond heartbeats):",
		rep.Publications, rep.Window, rep.Found, len(moved))}
	out = append(out, moved...)
	for _, n := range rep.Notes {
		out = append(out, "  "+n)
	}
	if copies := rep.Copies(); len(copies) > 0 {
		nodes := make([]string, 0, len(copies))
		for n := range copies {
			nodes = append(nodes, n)
		}
		slices.Sort(nodes)
		parts := make([]string, len(nodes))
		for i, n := range nodes {
			parts[i] = n + " " + signed(copies[n])
		}
		out = append(out, "Copies of one publication sent on the links (sent data frames less heartbeats, per publication), by node: "+strings.Join(parts, ", "))
		byLink := rep.CopiesByLink()
		links := make([]string, 0, len(byLink))
		for p, v := range byLink {
			if v != 0 {
				links = append(links, p)
			}
		}
		slices.Sort(links)
		for i, p := range links {
			links[i] = p + " " + signed(byLink[p])
		}
		if len(links) == 0 {
			links = []string{"none"}
		}
		out = append(out, "  by link (those not 0): "+strings.Join(links, ", "))
	}
	return out
}

func signed(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%+.0f", v)
	}
	return fmt.Sprintf("%+.3g", v)
}
