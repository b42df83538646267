package meta

import (
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

type tcpStream struct{ net.Listener }

func (s tcpStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

// TestClosingStream: the connections the stream accepted are closed by
// closeAccepted, and one accepted later is closed at once.
func TestClosingStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := newClosingStream(tcpStream{ln})
	defer s.Close()
	out, err := s.Dial(raft.ServerAddress(ln.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	in, err := s.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.closeAccepted()
	if _, err := in.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write on an accepted connection after closeAccepted: %v, want net.ErrClosed", err)
	}
	late, err := s.Dial(raft.ServerAddress(ln.Addr().String()), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if c, err := s.Accept(); err == nil {
		t.Fatalf("a connection accepted after closeAccepted: %v", c.RemoteAddr())
	}
}

// TestBoltStoreWriteAfterClose: a term saved after the store closed is
// dropped without an error (raft would panic on one), and not written.
func TestBoltStoreWriteAfterClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	s, err := openBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 4); err != nil {
		t.Fatalf("a write after Close: %v, want none", err)
	}
	if err := s.StoreLogs([]*raft.Log{{Index: 1, Term: 4}}); err != nil {
		t.Fatalf("logs stored after Close: %v, want none", err)
	}
	s, err = openBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if term, err := s.GetUint64([]byte("CurrentTerm")); err != nil || term != 3 {
		t.Fatalf("term %d, %v after reopening; want 3", term, err)
	}
}
