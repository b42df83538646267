package node

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
)

// TLSFiles names the PEM files of a listener's TLS.
type TLSFiles struct {
	// CertFile and KeyFile are the server's certificate (chain) and
	// private key. Setting both turns TLS on. Default: "" (plain TCP).
	CertFile string `toml:"cert_file"`
	KeyFile  string `toml:"key_file"`
	// ClientCAFile, when set, makes the listener require a client
	// certificate signed by one of the CAs it holds, and refuse clients
	// without one. Default: "" (no client certificates asked).
	ClientCAFile string `toml:"client_ca_file"`
}

// Enabled reports whether f turns TLS on.
func (f TLSFiles) Enabled() bool { return f.CertFile != "" || f.KeyFile != "" }

// Validate checks that f names both a certificate and a key, or neither.
func (f TLSFiles) Validate() error {
	if (f.CertFile == "") != (f.KeyFile == "") {
		return fmt.Errorf("node: TLS needs both a certificate file and a key file")
	}
	if f.ClientCAFile != "" && f.CertFile == "" {
		return fmt.Errorf("node: client certificates (a client CA file) need TLS: give a certificate and a key")
	}
	return nil
}

// tlsFiles serves a TLS config read from files, and reads them again on
// reload: handshakes after a reload use the new certificate, connections
// already open keep theirs.
type tlsFiles struct {
	files    TLSFiles
	listener string // "client" or "management", for the log
	log      *slog.Logger
	cur      atomic.Pointer[tls.Config]
}

func newTLSFiles(f TLSFiles, listener string, log *slog.Logger) (*tlsFiles, error) {
	t := &tlsFiles{files: f, listener: listener, log: log}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

// load reads the files; on an error the config in use stays. A
// certificate that has expired, is not valid yet or expires within
// certExpiryWarning is loaded all the same, with a warning: clients
// refuse it (x509: certificate has expired or is not yet valid), and the
// operator must know why.
func (t *tlsFiles) load() error {
	cert, err := tls.LoadX509KeyPair(t.files.CertFile, t.files.KeyFile)
	if err != nil {
		return fmt.Errorf("node: TLS certificate %s, key %s: %w", t.files.CertFile, t.files.KeyFile, err)
	}
	t.warnValidity(cert, time.Now())
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if t.files.ClientCAFile != "" {
		pool, err := loadCAs(t.files.ClientCAFile)
		if err != nil {
			return err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	t.cur.Store(cfg)
	return nil
}

// certExpiryWarning is how long before its end a certificate in use is
// reported as expiring soon.
const certExpiryWarning = 14 * 24 * time.Hour

// warnValidity logs, for each certificate of the chain, whether it has
// expired, is not valid yet or expires soon at now.
func (t *tlsFiles) warnValidity(cert tls.Certificate, now time.Time) {
	for i, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			continue // tls.LoadX509KeyPair parsed the leaf; a bad intermediate shows in handshakes
		}
		msg, extra := certValidity(c, now)
		if msg == "" {
			continue
		}
		attrs := []any{"listener", t.listener, "file", t.files.CertFile, "subject", c.Subject.String(),
			"not_before", c.NotBefore.UTC().Format(time.RFC3339), "not_after", c.NotAfter.UTC().Format(time.RFC3339)}
		if i > 0 {
			attrs = append(attrs, "chain_index", i)
		}
		t.log.Warn(msg, append(attrs, extra...)...)
	}
}

// certValidity says what is wrong with c's validity at now: a log
// message and its extra attributes, or "" when nothing is.
func certValidity(c *x509.Certificate, now time.Time) (string, []any) {
	switch {
	case now.After(c.NotAfter):
		return "TLS certificate has expired: clients refuse it (x509: certificate has expired); renew it and reload (SIGHUP)",
			[]any{"expired_for", now.Sub(c.NotAfter).Round(time.Second).String()}
	case now.Before(c.NotBefore):
		return "TLS certificate is not valid yet: clients refuse it until not_before (is the clock right?)",
			[]any{"valid_in", c.NotBefore.Sub(now).Round(time.Second).String()}
	case c.NotAfter.Sub(now) < certExpiryWarning:
		return "TLS certificate expires soon; renew it and reload (SIGHUP)",
			[]any{"expires_in", c.NotAfter.Sub(now).Round(time.Second).String()}
	}
	return "", nil
}

// config returns the config to give a listener: each handshake takes the
// files' latest config.
func (t *tlsFiles) config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	}
}

// loadCAs reads a PEM file of CA certificates.
func loadCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("node: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("node: CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}
