package cluster

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"time"
)

// Kind names what a connection to the cluster address carries. Every
// connection states its kind in its first bytes; the listener hands it
// to whoever serves that kind ([Fabric.Listener]).
type Kind uint8

// Connection kinds. Others may add theirs after KindGossip; a kind
// nobody serves is refused in the handshake.
const (
	KindMemberlist  Kind = 1 // memberlist's streams (push/pull, fallback probes)
	KindRaft        Kind = 2 // the metadata Raft group's transport
	KindMetaRPC     Kind = 3 // requests to the metadata leader
	KindLinkControl Kind = 4 // a node link's control connection
	KindLinkData    Kind = 5 // a node link's data connection
	KindGossip      Kind = 6 // memberlist's packets, with mutual TLS and no secret
	KindQueueRaft   Kind = 7 // the replicated queues' Raft messages (internal/cluster/replica)
	KindQueueOps    Kind = 8 // a replicated queue's status asked of its leader's node (node)
)

func (k Kind) String() string {
	switch k {
	case KindMemberlist:
		return "memberlist"
	case KindRaft:
		return "raft"
	case KindMetaRPC:
		return "meta-rpc"
	case KindLinkControl:
		return "link-control"
	case KindLinkData:
		return "link-data"
	case KindGossip:
		return "gossip"
	case KindQueueRaft:
		return "queue-raft"
	case KindQueueOps:
		return "queue-ops"
	}
	return fmt.Sprintf("kind-%d", uint8(k))
}

// The handshake. In clear, the dialer sends the preamble:
//
//	"COURCL" | version u8 (1) | kind u8 | security u8
//
// and the listener answers two bytes: a status (statusOK or why not)
// and its own security. Then, unless both run without security, TLS 1.3
// (the dialer is the TLS client). Then, over TLS, each side sends a
// hello: a u16 big-endian length (at most maxHello) and JSON
// {"name", "addr", "mac"}; the dialer first, the listener after it has
// checked the dialer's. With a cluster secret, mac is HMAC-SHA256 under
// the secret of the side's role, the kind, its name and address, and
// keying material exported from the TLS session: a peer without the
// secret cannot make it, the secret never crosses the wire, and a man
// in the middle, who must run two TLS sessions with different keying
// material, cannot relay it. The listener answers a refused hello with
// {"error"}, so that the dialer can log why.
const (
	magic       = "COURCL"
	hsVersion   = 1
	preambleLen = len(magic) + 3
	maxHello    = 1024
	ekmLabel    = "EXPORTER-courier-cluster-auth"
	macContext  = "courier cluster v1"
)

// Security modes, the preamble's last byte: bits that both sides must
// agree on.
const (
	secSecret byte = 1 << 0 // TLS with ephemeral certificates, HMAC proof of the secret
	secMTLS   byte = 1 << 1 // TLS with certificates signed by the cluster CA, both ways
	secAll         = secSecret | secMTLS
)

// Listener answers to the preamble.
const (
	statusOK       byte = 0
	statusVersion  byte = 1 // bad magic or version
	statusSecurity byte = 2 // the security modes differ
	statusKind     byte = 3 // nobody serves this kind here
	statusBusy     byte = 4 // too many handshakes in progress
)

func securityName(mode byte) string {
	switch mode {
	case 0:
		return "none (loopback only)"
	case secSecret:
		return "cluster secret"
	case secMTLS:
		return "mutual TLS"
	case secAll:
		return "mutual TLS and cluster secret"
	}
	return fmt.Sprintf("unknown (%d)", mode)
}

// hello is what each side says of itself once the connection is secure.
type hello struct {
	Name  string `json:"name,omitempty"`
	Addr  string `json:"addr,omitempty"`
	MAC   []byte `json:"mac,omitempty"`
	Error string `json:"error,omitempty"`
}

// security holds what the handshake needs to authenticate peers.
type security struct {
	mode   byte
	secret []byte
	server *tls.Config // nil in mode 0
	client *tls.Config
}

// Conn is an authenticated connection of the cluster address: its peer
// proved membership in the handshake.
type Conn struct {
	net.Conn
	kind     Kind
	peer     string
	peerAddr string
}

// NetConn returns the connection under c (a TCP or TLS connection).
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Kind returns what the connection carries.
func (c *Conn) Kind() Kind { return c.kind }

// Peer returns the name the peer node gave in the handshake.
func (c *Conn) Peer() string { return c.peer }

// PeerAddr returns the cluster address the peer node advertises.
func (c *Conn) PeerAddr() string { return c.peerAddr }

// refused returns an authentication failure with its reason.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrAuth, fmt.Sprintf(format, args...))
}

// clientHandshake runs the dialer's side on conn within timeout; on
// success the returned Conn's deadlines are cleared.
func (s *security) clientHandshake(conn net.Conn, kind Kind, self hello, timeout time.Duration) (*Conn, error) {
	conn.SetDeadline(time.Now().Add(timeout))
	pre := make([]byte, 0, preambleLen)
	pre = append(append(pre, magic...), hsVersion, byte(kind), s.mode)
	if _, err := conn.Write(pre); err != nil {
		return nil, fmt.Errorf("%w: writing the preamble: %w", ErrHandshake, err)
	}
	var ans [2]byte
	if _, err := io.ReadFull(conn, ans[:]); err != nil {
		return nil, fmt.Errorf("%w: reading the answer to the preamble: %w", ErrHandshake, err)
	}
	switch ans[0] {
	case statusOK:
	case statusSecurity:
		return nil, refused("the peer's cluster security is %s, this node's is %s: give every node the same --cluster-secret-file and cluster TLS settings",
			securityName(ans[1]), securityName(s.mode))
	case statusVersion:
		return nil, fmt.Errorf("%w: the peer does not speak this cluster protocol version", ErrHandshake)
	case statusKind:
		return nil, fmt.Errorf("%w: the peer does not serve %s connections", ErrHandshake, kind)
	case statusBusy:
		return nil, fmt.Errorf("%w: the peer has too many handshakes in progress", ErrHandshake)
	default:
		return nil, fmt.Errorf("%w: unknown answer %d to the preamble", ErrHandshake, ans[0])
	}
	c := conn
	var ekm []byte
	if s.mode != 0 {
		tc := tls.Client(conn, s.client)
		if err := tc.Handshake(); err != nil {
			return nil, refused("TLS: %v", err)
		}
		var err error
		if ekm, err = exportKey(tc); err != nil {
			return nil, err
		}
		c = tc
	}
	self.MAC = s.mac('c', kind, self, ekm)
	if err := writeHello(c, self); err != nil {
		return nil, err
	}
	peer, err := readHello(c)
	if err != nil {
		if remoteAlert(err) {
			// TLS 1.3: the listener checks the dialer's certificate
			// after the dialer's handshake ended.
			return nil, refused("TLS: %v", err)
		}
		return nil, err
	}
	if peer.Error != "" {
		return nil, refused("the peer refused: %s", peer.Error)
	}
	if err := checkName(peer); err != nil {
		return nil, err
	}
	if !s.verify('s', kind, peer, ekm) {
		return nil, refused("the peer did not prove the cluster secret: the secrets differ")
	}
	c.SetDeadline(time.Time{})
	return &Conn{Conn: c, kind: kind, peer: peer.Name, peerAddr: peer.Addr}, nil
}

// serverHandshake runs the listener's side on conn within timeout.
// serves reports whether a kind is served here. On success the returned
// Conn's deadlines are cleared.
func (s *security) serverHandshake(conn net.Conn, serves func(Kind) bool, self hello, timeout time.Duration) (*Conn, error) {
	conn.SetDeadline(time.Now().Add(timeout))
	var pre [preambleLen]byte
	if n, err := io.ReadFull(conn, pre[:]); err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %w", ErrHandshake, io.EOF)
		}
		return nil, fmt.Errorf("%w: reading the preamble: %w", ErrHandshake, err)
	}
	answer := func(status byte) { conn.Write([]byte{status, s.mode}) }
	kind, mode := Kind(pre[len(magic)+1]), pre[len(magic)+2]
	switch {
	case string(pre[:len(magic)]) != magic || pre[len(magic)] != hsVersion:
		answer(statusVersion)
		return nil, fmt.Errorf("%w: not a cluster connection of this version (it began %q)", ErrHandshake, pre[:])
	case mode != s.mode:
		answer(statusSecurity)
		return nil, refused("the peer's cluster security is %s, this node's is %s", securityName(mode), securityName(s.mode))
	case !serves(kind):
		answer(statusKind)
		return nil, fmt.Errorf("%w: nobody serves %s connections here", ErrHandshake, kind)
	}
	if _, err := conn.Write([]byte{statusOK, s.mode}); err != nil {
		return nil, fmt.Errorf("%w: answering the preamble: %w", ErrHandshake, err)
	}
	c := conn
	var ekm []byte
	if s.mode != 0 {
		tc := tls.Server(conn, s.server)
		if err := tc.Handshake(); err != nil {
			return nil, refused("TLS: %v", err)
		}
		var err error
		if ekm, err = exportKey(tc); err != nil {
			return nil, err
		}
		c = tc
	}
	peer, err := readHello(c)
	if err != nil {
		return nil, err
	}
	if err := checkName(peer); err != nil {
		writeHello(c, hello{Error: err.Error()})
		return nil, err
	}
	if !s.verify('c', kind, peer, ekm) {
		writeHello(c, hello{Error: "authentication failed: the cluster secrets differ"})
		return nil, refused("node %q did not prove the cluster secret: the secrets differ", peer.Name)
	}
	self.MAC = s.mac('s', kind, self, ekm)
	if err := writeHello(c, self); err != nil {
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return &Conn{Conn: c, kind: kind, peer: peer.Name, peerAddr: peer.Addr}, nil
}

// remoteAlert reports whether err is a TLS alert from the peer.
func remoteAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}

// checkName checks the name and address a peer gave.
func checkName(h hello) error {
	if h.Name == "" || len(h.Name) > maxName {
		return fmt.Errorf("%w: a node name of %d bytes (1 to %d)", ErrHandshake, len(h.Name), maxName)
	}
	if len(h.Addr) > maxName {
		return fmt.Errorf("%w: an address of %d bytes", ErrHandshake, len(h.Addr))
	}
	return nil
}

// maxName bounds a node's name and address in a hello.
const maxName = 255

func exportKey(tc *tls.Conn) ([]byte, error) {
	cs := tc.ConnectionState()
	ekm, err := cs.ExportKeyingMaterial(ekmLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("%w: exporting TLS keying material: %w", ErrHandshake, err)
	}
	return ekm, nil
}

// mac returns the proof of the secret for a side (role 'c' or 's'), or
// nil without a secret.
func (s *security) mac(role byte, kind Kind, h hello, ekm []byte) []byte {
	if len(s.secret) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte(macContext))
	var b []byte
	b = append(b, 0, role, byte(kind))
	b = binary.AppendUvarint(b, uint64(len(h.Name)))
	b = append(b, h.Name...)
	b = binary.AppendUvarint(b, uint64(len(h.Addr)))
	b = append(b, h.Addr...)
	m.Write(b)
	m.Write(ekm)
	return m.Sum(nil)
}

// verify checks a peer's proof of the secret; true without a secret.
func (s *security) verify(role byte, kind Kind, h hello, ekm []byte) bool {
	if len(s.secret) == 0 {
		return true
	}
	return hmac.Equal(h.MAC, s.mac(role, kind, h, ekm))
}

func writeHello(w io.Writer, h hello) error {
	b, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	if len(b) > maxHello {
		return fmt.Errorf("%w: hello of %d bytes, limit %d", ErrHandshake, len(b), maxHello)
	}
	out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(b)), uint16(len(b)))
	if _, err := w.Write(append(out, b...)); err != nil {
		return fmt.Errorf("%w: writing the hello: %w", ErrHandshake, err)
	}
	return nil
}

func readHello(r io.Reader) (hello, error) {
	var h hello
	var n [2]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return h, fmt.Errorf("%w: reading the hello: %w", ErrHandshake, err)
	}
	size := int(binary.BigEndian.Uint16(n[:]))
	if size > maxHello {
		return h, fmt.Errorf("%w: hello of %d bytes, limit %d", ErrHandshake, size, maxHello)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return h, fmt.Errorf("%w: reading the hello: %w", ErrHandshake, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&h); err != nil {
		return h, fmt.Errorf("%w: hello: %w", ErrHandshake, err)
	}
	return h, nil
}

// ephemeralCert makes a self-signed certificate for the secret mode,
// where TLS only encrypts and the HMAC authenticates.
func ephemeralCert() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "courier-cluster"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// newSecurity builds the handshake's security from a secret and the
// cluster TLS files (a certificate, its key and the cluster CA; all or
// none).
func newSecurity(secret []byte, certFile, keyFile, caFile string) (*security, error) {
	s := &security{secret: secret}
	if len(secret) > 0 {
		s.mode |= secSecret
	}
	if certFile != "" || keyFile != "" || caFile != "" {
		if certFile == "" || keyFile == "" || caFile == "" {
			return nil, errors.New("cluster: mutual TLS needs a certificate, its key and the cluster CA file")
		}
		s.mode |= secMTLS
	}
	switch {
	case s.mode&secMTLS != 0:
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("cluster: TLS certificate %s, key %s: %w", certFile, keyFile, err)
		}
		pem, err := readFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("cluster: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("cluster: CA file %s holds no PEM certificate", caFile)
		}
		verify := verifyCA(pool)
		s.server = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			ClientAuth: tls.RequireAnyClientCert, VerifyPeerCertificate: verify}
		// The CA's signature authenticates a peer, whatever host name
		// its certificate names: nodes dial each other by address.
		s.client = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
			InsecureSkipVerify: true, VerifyPeerCertificate: verify}
	case s.mode&secSecret != 0:
		cert, err := ephemeralCert()
		if err != nil {
			return nil, fmt.Errorf("cluster: ephemeral certificate: %w", err)
		}
		s.server = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}
		// The HMAC over the session's keying material authenticates.
		s.client = &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	}
	return s, nil
}

// verifyCA checks that the peer's certificate chains to the cluster CA.
func verifyCA(pool *x509.CertPool) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no certificate")
		}
		certs := make([]*x509.Certificate, len(raw))
		for i, der := range raw {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return err
			}
			certs[i] = c
		}
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err != nil {
			return fmt.Errorf("certificate not signed by the cluster CA: %w", err)
		}
		return nil
	}
}
