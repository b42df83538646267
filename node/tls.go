package node

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync/atomic"
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
	files TLSFiles
	cur   atomic.Pointer[tls.Config]
}

func newTLSFiles(f TLSFiles) (*tlsFiles, error) {
	t := &tlsFiles{files: f}
	if err := t.load(); err != nil {
		return nil, err
	}
	return t, nil
}

// load reads the files; on an error the config in use stays.
func (t *tlsFiles) load() error {
	cert, err := tls.LoadX509KeyPair(t.files.CertFile, t.files.KeyFile)
	if err != nil {
		return fmt.Errorf("node: TLS certificate %s, key %s: %w", t.files.CertFile, t.files.KeyFile, err)
	}
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
