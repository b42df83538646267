package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test, in memory: no key
// ever lives in the repository.
type CA struct {
	t    testing.TB
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// Pool holds the CA's certificate, for RootCAs or ClientCAs.
	Pool *x509.CertPool
	// File is the CA's certificate as a PEM file in a test directory.
	File string
}

// Cert is a certificate issued by a test CA.
type Cert struct {
	// TLS is the certificate and key, for tls.Config.Certificates.
	TLS tls.Certificate
	// CertFile and KeyFile hold them as PEM files in a test directory.
	CertFile, KeyFile string
}

// newKey makes a P-256 key and a certificate template for cn, valid for
// an hour.
func newKey(t testing.TB, cn string) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key, &x509.Certificate{
		SerialNumber: nextSerial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
	}
}

// nextSerial returns a random serial number.
func nextSerial() *big.Int {
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		panic(err)
	}
	return n
}

// NewCA makes a CA valid for an hour.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, tmpl := newKey(t, "Courier test CA")
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	dir := t.TempDir()
	file := filepath.Join(dir, "ca.pem")
	writePEM(t, file, "CERTIFICATE", der)
	return &CA{t: t, cert: cert, key: key, Pool: pool, File: file}
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost.
func (ca *CA) Server() Cert {
	ca.t.Helper()
	return ca.issue("courier test server", x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate with the common name cn.
func (ca *CA) Client(cn string) Cert {
	ca.t.Helper()
	return ca.issue(cn, x509.ExtKeyUsageClientAuth)
}

// ServerValid issues a server certificate as Server does, valid from
// notBefore to notAfter: for tests of expired and not yet valid
// certificates.
func (ca *CA) ServerValid(notBefore, notAfter time.Time) Cert {
	ca.t.Helper()
	return ca.issueValid("courier test server", x509.ExtKeyUsageServerAuth, notBefore, notAfter)
}

func (ca *CA) issue(cn string, usage x509.ExtKeyUsage) Cert {
	ca.t.Helper()
	return ca.issueValid(cn, usage, time.Time{}, time.Time{})
}

// issueValid issues a certificate; zero times keep newKey's validity.
func (ca *CA) issueValid(cn string, usage x509.ExtKeyUsage, notBefore, notAfter time.Time) Cert {
	t := ca.t
	t.Helper()
	key, tmpl := newKey(t, cn)
	if !notBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	if usage == x509.ExtKeyUsageServerAuth {
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := Cert{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	writePEM(t, c.CertFile, "CERTIFICATE", der)
	writePEM(t, c.KeyFile, "PRIVATE KEY", keyDER)
	c.TLS, err = tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
