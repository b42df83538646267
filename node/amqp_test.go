package node

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/courier-mq/courier/internal/amqp"
	"github.com/courier-mq/courier/internal/testutil"
)

func TestAMQPListener(t *testing.T) {
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if n.Addr() != nil {
		t.Fatalf("client listener %v without Listen", n.Addr())
	}
	url := n.AMQPURL()
	if !strings.HasPrefix(url, "amqp://127.0.0.1:") {
		t.Fatalf("AMQP URL %q", url)
	}
	c, err := amqp091.Dial(strings.Replace(url, "amqp://", "amqp://guest:guest@", 1))
	if err != nil {
		t.Fatal(err)
	}
	closed := c.NotifyClose(make(chan *amqp091.Error, 1))
	if _, err := c.Channel(); err != nil {
		t.Fatal(err)
	}
	n.Close()
	if e := testutil.Recv(t, closed, 30*time.Second); e == nil || e.Code != amqp.ConnectionForced {
		t.Fatalf("on node close: %v, want 320", e)
	}
}

func TestAMQPTLS(t *testing.T) {
	ca := testutil.NewCA(t)
	cert := ca.Server()
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0",
		TLS: TLSFiles{CertFile: cert.CertFile, KeyFile: cert.KeyFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	url := n.AMQPURL()
	if !strings.HasPrefix(url, "amqps://") {
		t.Fatalf("AMQP URL %q with TLS", url)
	}
	c, err := amqp091.DialTLS(strings.Replace(url, "amqps://", "amqps://guest:guest@", 1), &tls.Config{RootCAs: ca.Pool})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestAMQPBeyondLoopbackNeedsUsers(t *testing.T) {
	_, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "0.0.0.0:0"})
	if err == nil || !strings.Contains(err.Error(), "amqp listener") {
		t.Fatalf("AMQP on 0.0.0.0 without users: %v", err)
	}
	// A busy address fails Start with amqp.ErrListen.
	n, err := Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	_, err = Start(Config{DataDir: t.TempDir(), Log: quiet, AMQP: n.AMQPAddr().String()})
	if !errors.Is(err, amqp.ErrListen) {
		t.Fatalf("AMQP on a busy address: %v", err)
	}
}
