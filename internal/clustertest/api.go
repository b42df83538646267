//go:build linux

package clustertest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// HTTPClient is an HTTP client whose connections are dialed from node i's
// network, for the management API of any node that network reaches.
func (c *Cluster) HTTPClient(i int) *http.Client {
	return &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return c.DialContext(ctx, i, network, addr)
			},
			DisableKeepAlives: true,
		},
	}
}

// maxAPIBody bounds what GetJSON reads.
const maxAPIBody = 4 << 20

// GetJSON reads path (such as "/api/nodes") from the node's management
// API, from the node's own network, as the administrator, into out.
func (n *Node) GetJSON(path string, out any) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+n.HTTPAddr+path, nil)
	if err != nil {
		return err
	}
	if n.c.mode == ModeNetns {
		req.SetBasicAuth(AdminUser, n.c.secret)
	}
	resp, err := n.c.HTTPClient(n.Index).Do(req)
	if err != nil {
		return fmt.Errorf("clustertest: %s %s: %w", n.Name, path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIBody))
	if err != nil {
		return fmt.Errorf("clustertest: %s %s: %w", n.Name, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("clustertest: %s %s: %s: %.200s", n.Name, path, resp.Status, body)
	}
	return json.Unmarshal(body, out)
}

// NodeView is a row of GET /api/nodes: a node as the node serving the
// API sees it.
type NodeView struct {
	Name       string `json:"name"`
	State      string `json:"state"` // alive, suspect, dead or left
	MetaLeader bool   `json:"meta_leader"`
	// Links are the serving node's links: to every other node in its
	// own row, to the row's node in the others.
	Links []LinkView `json:"links"`
}

// LinkView is a node link as /api/nodes shows it.
type LinkView struct {
	Peer  string `json:"peer"`
	Up    bool   `json:"up"`
	Since int64  `json:"since"` // unix ms: when it came up, or went down
}

// View is what node n sees of the cluster (GET /api/nodes).
func (n *Node) View() ([]NodeView, error) {
	var v []NodeView
	err := n.GetJSON("/api/nodes", &v)
	return v, err
}

// alive counts the nodes a view shows alive.
func alive(v []NodeView) int {
	k := 0
	for _, x := range v {
		if x.State == "alive" {
			k++
		}
	}
	return k
}

// WaitView polls node n's view until ok accepts it or timeout passes.
func (n *Node) WaitView(timeout time.Duration, ok func([]NodeView) bool) ([]NodeView, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := n.View()
		if err == nil && ok(v) {
			return v, nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("clustertest: %s sees %+v after %v", n.Name, v, timeout)
			}
			return v, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// MetaLeader returns the index of the node that some running node's view
// names as the metadata leader, or an error if none does.
func (c *Cluster) MetaLeader() (int, error) {
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		v, err := n.View()
		if err != nil {
			continue
		}
		for _, x := range v {
			if x.MetaLeader {
				for _, m := range c.nodes {
					if m.Name == x.Name {
						return m.Index, nil
					}
				}
			}
		}
	}
	return -1, ErrNoMetaLeader
}

// QueueLeader returns the index of the node that serves the replicated
// queue name: the node its /api/queues/{name} names as "leader" where
// the API tells it, or else the one running node that answers for the
// queue (a node lists the replicated queues it serves). It polls for up
// to timeout, for a queue between two leaders.
func (c *Cluster) QueueLeader(name string, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		if i, ok := c.queueLeader(name); ok {
			return i, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("%w: queue %q after %v", ErrNoQueueLeader, name, timeout)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// queueLeader asks every running node once.
func (c *Cluster) queueLeader(name string) (int, bool) {
	serving := -1
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		var q struct {
			Leader string `json:"leader"`
		}
		if err := n.GetJSON("/api/queues/"+url.PathEscape(name), &q); err != nil {
			continue
		}
		if q.Leader != "" {
			if i := c.nodeIndex(q.Leader); i >= 0 && c.nodes[i].Running() {
				return i, true
			}
			continue
		}
		if serving >= 0 {
			return -1, false // two serve it: a leader on its way out
		}
		serving = n.Index
	}
	return serving, serving >= 0
}

// nodeIndex returns the index of the node called name, or -1.
func (c *Cluster) nodeIndex(name string) int {
	for _, n := range c.nodes {
		if n.Name == name {
			return n.Index
		}
	}
	return -1
}
