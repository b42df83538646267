package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// secFlags are the credentials and TLS options of the client tools, for
// the wire (pub, sub, ...) and for the management API (overview, users,
// ...) alike.
type secFlags struct {
	user, password string
	caFile         string
	// certFile and keyFile are a client certificate; wire tools only.
	certFile, keyFile string
}

func (s *secFlags) add(cmd *cobra.Command, clientCert bool) {
	f := cmd.Flags()
	f.StringVar(&s.user, "user", os.Getenv("COURIER_USER"), "user name, when the server has users (env COURIER_USER; or user:password@ in the URL)")
	f.StringVar(&s.password, "password", os.Getenv("COURIER_PASSWORD"), "password (env COURIER_PASSWORD, which other users of this machine cannot see in the process list)")
	f.StringVar(&s.caFile, "tls-ca", os.Getenv("COURIER_TLS_CA"), "PEM file of the CA that signed the server's certificate, for TLS (env COURIER_TLS_CA)")
	if clientCert {
		f.StringVar(&s.certFile, "tls-cert", "", "PEM file of a client certificate, for a server that asks for one")
		f.StringVar(&s.keyFile, "tls-key", "", "PEM file of the client certificate's key")
	}
}

// tlsConfig returns the TLS config the flags ask for, or nil when they
// ask for nothing beyond the system's roots.
func (s *secFlags) tlsConfig() (*tls.Config, error) {
	if s.caFile == "" && s.certFile == "" && s.keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", s.caFile)
		}
	}
	if (s.certFile == "") != (s.keyFile == "") {
		return nil, fmt.Errorf("a client certificate needs both --tls-cert and --tls-key")
	}
	if s.certFile != "" {
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
