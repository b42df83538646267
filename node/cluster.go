package node

import (
	"fmt"
	"os"
	"time"

	"github.com/courier-mq/courier/internal/admin"
	"github.com/courier-mq/courier/internal/buildinfo"
	"github.com/courier-mq/courier/internal/cluster"
	"github.com/courier-mq/courier/internal/queue"
)

// ClusterConfig makes a node one of a cluster. The toml keys are those
// of the [cluster] table of `courier server`'s configuration
// (docs/operations.md, docs/cluster.md).
type ClusterConfig struct {
	// Listen is the cluster address: a TCP listener for the node links
	// and the other nodes' streams, and UDP on the same port for
	// memberlist's packets, such as "127.0.0.1:7500" (port 0 picks a
	// free one; see [Node.ClusterAddr]). Default: "" (a single node:
	// nothing of the cluster runs).
	//
	// An address beyond loopback needs a secret or TLS: without either
	// anyone who reaches it could join.
	Listen string `toml:"listen"`
	// Advertise is the address the other nodes reach this one at.
	// Default: the address listened on, which must then name an IP
	// address (not 0.0.0.0).
	Advertise string `toml:"advertise"`
	// Join lists the cluster addresses of seed nodes, tried in the
	// background until one answers. Default: none (the first node).
	Join []string `toml:"join"`
	// SecretFile holds the shared cluster secret (16 bytes to 4 KiB,
	// readable by its owner only); every node of the cluster must have
	// the same. Default: "" (none). `courier server` also takes it from
	// COURIER_CLUSTER_SECRET.
	SecretFile string `toml:"secret_file"`
	// Secret is the shared cluster secret itself, for embedders; it
	// wins over SecretFile.
	Secret []byte `toml:"-"`
	// TLS turns mutual TLS on between nodes: this node's certificate
	// and key, and in ClientCAFile the cluster CA, which must have
	// signed every node's certificate. Without a secret, memberlist's
	// packets then travel over TCP. Default: none.
	TLS TLSFiles `toml:"tls"`
	// BootstrapExpect is how many nodes the cluster first forms with,
	// as Consul's bootstrap_expect: a node without metadata state waits
	// until it has met that many before the metadata group starts.
	// Start exactly that many nodes for the first formation, and add
	// the others after. -1: never bootstrap (the node waits to be added
	// to a formed cluster). Default: 1 + the number of Join addresses.
	BootstrapExpect int `toml:"bootstrap_expect"`
}

// Enabled reports whether c makes the node one of a cluster.
func (c ClusterConfig) Enabled() bool { return c.Listen != "" }

// Validate checks the cluster configuration.
func (c ClusterConfig) Validate() error {
	if !c.Enabled() {
		if len(c.Join) > 0 || c.SecretFile != "" || c.TLS.Enabled() || c.Advertise != "" {
			return fmt.Errorf("node: cluster settings without a cluster address (cluster.listen, --cluster)")
		}
		return nil
	}
	if c.TLS.Enabled() && (c.TLS.CertFile == "" || c.TLS.KeyFile == "" || c.TLS.ClientCAFile == "") {
		return fmt.Errorf("node: cluster TLS needs a certificate, its key and the cluster CA (cluster.tls.client_ca_file)")
	}
	return nil
}

// startCluster starts the node's fabric, when the config asks for one.
func (n *Node) startCluster() error {
	cc := n.cfg.Cluster
	if !cc.Enabled() {
		return nil
	}
	secret := cc.Secret
	if len(secret) == 0 && cc.SecretFile != "" {
		var err error
		if secret, err = cluster.ReadSecret(cc.SecretFile); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	} else if len(secret) > 0 {
		if _, err := cluster.CheckSecret(secret); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	f, err := cluster.New(cluster.Config{
		Name: n.cfg.Name, Listen: cc.Listen, Advertise: cc.Advertise, Join: cc.Join,
		Secret: secret, CertFile: cc.TLS.CertFile, KeyFile: cc.TLS.KeyFile, CAFile: cc.TLS.ClientCAFile,
		ClientURL: n.URL(), HTTPURL: n.HTTPURL(), Version: buildinfo.Version(), Started: n.started,
		Hosts:       n.hosts,
		MaxFrame:    n.cfg.Limits.MaxFrame + 64<<10,
		SlowTimeout: linkSlowTimeout(n.cfg.Limits.SlowConsumerTimeout), HandshakeTimeout: n.cfg.Limits.HandshakeTimeout,
		Log: n.cfg.Log,
	})
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.fabric = f
	if err := n.joinCluster(); err != nil {
		f.Close()
		n.fabric = nil
		return err
	}
	return nil
}

// hosts counts what the node hosts, gossiped to the other nodes.
func (n *Node) hosts() cluster.Hosts {
	h := cluster.Hosts{Connections: n.broker.SessionCount(), Exchanges: n.broker.ExchangeCount()}
	n.broker.RangeQueues(func(*queue.Queue, bool) bool {
		h.Queues++
		return true
	})
	return h
}

// Fabric returns the node's cluster fabric (membership and node links),
// or nil for a single node; for the packages of this module.
func (n *Node) Fabric() *cluster.Fabric { return n.fabric }

// connEnds returns the counts of network connections that ended
// abnormally, for the management API.
func (n *Node) connEnds() admin.ConnEnds {
	if n.srv == nil {
		return admin.ConnEnds{}
	}
	return admin.ConnEnds(n.srv.Ends())
}

// ClusterAddr returns the cluster address listened on, or nil for a
// single node.
func (n *Node) ClusterAddr() string {
	if n.fabric == nil {
		return ""
	}
	return n.fabric.Addr().String()
}

// clusterNodes returns the cluster as this node sees it, for the
// management API.
func (n *Node) clusterNodes() []admin.ClusterNode {
	ms := n.fabric.Members()
	var leader string // the metadata leader this node knows
	if m := n.hooks.meta.Load(); m != nil {
		leader = m.Leader()
	}
	out := make([]admin.ClusterNode, len(ms))
	for i, m := range ms {
		c := admin.ClusterNode{
			Name: m.Name, Self: m.Self, State: m.State, Since: m.Since, Started: m.Started,
			ClusterAddr: m.ClusterAddr, ClientURL: m.ClientURL, HTTPURL: m.HTTPURL, Version: m.Version,
			Connections: m.Hosts.Connections, Exchanges: m.Hosts.Exchanges, Queues: m.Hosts.Queues,
			MetaLeader: leader != "" && m.Name == leader,
		}
		if m.Self {
			for _, p := range ms {
				if !p.Self {
					c.Links = append(c.Links, adminLink(p))
				}
			}
		} else {
			c.Links = []admin.ClusterLink{adminLink(m)}
		}
		out[i] = c
	}
	return out
}

func adminLink(m cluster.Member) admin.ClusterLink {
	l := m.Link
	return admin.ClusterLink{Peer: m.Name, Up: l.Up, Since: l.Since, RTT: l.RTT,
		Control: admin.LinkCounters(l.Control), Data: admin.LinkCounters(l.Data),
		Cuts: admin.LinkCuts(l.Cuts), Dropped: l.Dropped}
}

// clusterSecretEnv names the environment variable `courier server`
// reads the cluster secret from.
const clusterSecretEnv = "COURIER_CLUSTER_SECRET"

// SecretFromEnv returns the cluster secret of COURIER_CLUSTER_SECRET, or
// nil; `courier server` uses it when no secret file is given.
func SecretFromEnv() []byte {
	if s := os.Getenv(clusterSecretEnv); s != "" {
		return []byte(s)
	}
	return nil
}

// linkSlowTimeout is how long a node link may take nothing before it is
// cut: longer than a client's (slow), since a link's reader may wait that
// long on one slow local subscriber while it fans a publication out, and
// the link must outlast it.
func linkSlowTimeout(slow time.Duration) time.Duration { return 2*slow + 5*time.Second }
