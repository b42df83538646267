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
// over one publication: every numeric field of GET /api/nodes whose path
// [isLinkPath] takes for a node-to-node link's, read on every node
// before and after, next to the same fields over an equal window
// without a publication (link heartbeats move some of them).
type LinkReport struct {
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
// cluster_links, NATS's routes). Adjust it here, and isCopyPath, once
// the names are known.
func isLinkPath(path string) bool {
	p := strings.ToLower(path)
	return strings.Contains(p, "link") || strings.Contains(p, "route") || strings.Contains(p, "peer")
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

// Copies sums, by sending node, the sent-frame or sent-message fields
// ([isCopyPath]) over the publication minus their idle moves: the copies
// of the one publication that crossed the links. A field reported by
// several nodes (each node's /api/nodes may show the whole cluster) is
// counted once. The node is the first part of the path.
func (rep *LinkReport) Copies() map[string]float64 {
	byPath := map[string]float64{}
	for _, c := range rep.Counters {
		if !isCopyPath(c.Path) {
			continue
		}
		if v, ok := byPath[c.Path]; !ok || c.Delta-c.Idle > v {
			byPath[c.Path] = c.Delta - c.Idle
		}
	}
	out := map[string]float64{}
	for path, v := range byPath {
		node, _, _ := strings.Cut(path, ".")
		out[node] += v
	}
	return out
}

// maxNodesDoc bounds the GET /api/nodes document read from a node.
const maxNodesDoc = 16 << 20

// readNodes returns every numeric field of a node's GET /api/nodes, by
// path ([LinkCounter.Path]). Credentials in the URL
// (http://user:password@host:port) are sent as basic authentication.
func readNodes(ctx context.Context, base string) (map[string]float64, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	user := u.User
	u.User = nil
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/nodes"
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if user != nil {
		pw, _ := user.Password()
		req.SetBasicAuth(user.Username(), pw)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u.Redacted(), resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxNodesDoc+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxNodesDoc {
		return nil, fmt.Errorf("GET %s: more than %d bytes", u.Redacted(), maxNodesDoc)
	}
	return flattenJSON(b)
}

// flattenJSON returns the numeric leaves of a JSON document by path.
func flattenJSON(b []byte) (map[string]float64, error) {
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("GET /api/nodes: %w", err)
	}
	out := map[string]float64{}
	flatten(doc, "", 0, out)
	return out, nil
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

func readAllNodes(ctx context.Context, bases []string, errs map[string]error) linkSnapshot {
	s := linkSnapshot{}
	for _, b := range bases {
		m, err := readNodes(ctx, b)
		if err != nil {
			errs[b] = err
		}
		s[b] = m
	}
	return s
}

// measureLinks reads the nodes' link counters over an idle window, then
// over a window in which publish sends one message and delivered waits
// for it; the windows are equally long, at least window.
func measureLinks(ctx context.Context, bases []string, window time.Duration, publish func() error) (*LinkReport, error) {
	errs := map[string]error{}
	s0 := readAllNodes(ctx, bases, errs)
	sleepCtx(ctx, window)
	s1 := readAllNodes(ctx, bases, errs)
	start := time.Now()
	if err := publish(); err != nil {
		return nil, err
	}
	if rest := window - time.Since(start); rest > 0 {
		sleepCtx(ctx, rest)
	}
	elapsed := time.Since(start)
	s2 := readAllNodes(ctx, bases, errs)
	rep := &LinkReport{Window: max(window, elapsed).Seconds()}
	for _, b := range bases {
		if err := errs[b]; err != nil {
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s: %v", redact(b), err))
			continue
		}
		rep.add(redact(b), s0[b], s1[b], s2[b])
	}
	return rep, ctx.Err()
}

// add adds one node's link fields that moved, and a note if it has none.
func (rep *LinkReport) add(node string, s0, s1, s2 map[string]float64) {
	var paths, all []string
	for p := range s2 {
		all = append(all, p)
		if isLinkPath(p) {
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
		c := LinkCounter{Node: node, Path: p, Delta: s2[p] - s1[p], Idle: s1[p] - s0[p]}
		if c.Delta != 0 || c.Idle != 0 {
			rep.Counters = append(rep.Counters, c)
		}
	}
}

// Lines describe the report:
//
//	Link counters over one publication (GET /api/nodes of 5 nodes, 0.5 s windows; 40 link fields, 3 moved):
//	  http://127.0.0.1:7481  n1.cluster_links[n2].send_msgs  +1  (idle +0)
func (rep *LinkReport) Lines() []string {
	moved := 0
	for _, c := range rep.Counters {
		if c.Delta != c.Idle {
			moved++
		}
	}
	out := []string{fmt.Sprintf("Link counters over one publication (GET /api/nodes, %.1f s windows; %d link fields, %d moved more than when idle):",
		rep.Window, rep.Found, moved)}
	for _, c := range rep.Counters {
		out = append(out, fmt.Sprintf("  %s  %s  %s  (idle %s)", c.Node, c.Path, signed(c.Delta), signed(c.Idle)))
	}
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
		out = append(out, "Copies sent on the links for the publication (sent frames or messages, minus idle), by node: "+strings.Join(parts, ", "))
	}
	return out
}

func signed(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%+.0f", v)
	}
	return fmt.Sprintf("%+g", v)
}
