//go:build linux

package clustertest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// The fault proxy must tell which node a TCP connection comes from: it
// finds the connecting socket's inode, then the node process that has it
// open. Reading /proc/net/tcp for the inode walks the kernel's whole TCP
// hash table, some 30 ms on this machine however few sockets there are;
// done for each proxy on each new connection, on a loaded machine it
// left the test process (which runs the proxies) behind its connections:
// handshakes through the proxies passed their 5 s timeout, the nodes
// retried them, which cost more lookups, and a restarted node stayed out
// of the cluster for tens of seconds. sockInode asks the kernel for the
// one socket instead (NETLINK_SOCK_DIAG, an exact lookup by its four
// addresses), and /proc/net/tcp is read only when that fails.

// Netlink and sock_diag constants (linux/netlink.h, linux/sock_diag.h,
// linux/inet_diag.h).
const (
	netlinkSockDiag   = 4  // NETLINK_SOCK_DIAG (NETLINK_INET_DIAG)
	sockDiagByFamily  = 20 // SOCK_DIAG_BY_FAMILY
	nlmsgError        = 2  // NLMSG_ERROR
	nlmsgHdrLen       = 16
	inetDiagReqV2Len  = 56
	inetDiagMsgLen    = 72
	inetDiagInodeOff  = 68 // idiag_inode in struct inet_diag_msg
	inetDiagSockIDLen = 48
)

// procScans counts the reads of /proc/net/tcp, for tests: the proxies'
// common path must not need one.
var procScans atomic.Int64

// sockInode returns the inode of the TCP socket whose local address is
// local and remote address is remote: from sock_diag, else from
// /proc/net/tcp; 0 if neither finds it.
func sockInode(local, remote *net.TCPAddr) uint64 {
	if ino, err := diagInode(local, remote); err == nil {
		return ino
	}
	procScans.Add(1)
	return socketInode(local, remote)
}

// diagInode asks the kernel for the inode of one IPv4 TCP socket by its
// addresses (inet_diag_req_v2 without NLM_F_DUMP: an exact lookup).
func diagInode(local, remote *net.TCPAddr) (uint64, error) {
	src, dst := local.IP.To4(), remote.IP.To4()
	if src == nil || dst == nil {
		return 0, errors.New("clustertest: sock_diag: IPv4 only")
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, netlinkSockDiag)
	if err != nil {
		return 0, fmt.Errorf("clustertest: sock_diag: %w", err)
	}
	defer syscall.Close(fd)
	tv := syscall.NsecToTimeval(int64(time.Second))
	syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	if err := syscall.Sendto(fd, diagRequest(local.Port, remote.Port, src, dst), 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("clustertest: sock_diag: %w", err)
	}
	buf := make([]byte, 8192)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("clustertest: sock_diag: %w", err)
	}
	return diagAnswer(buf[:n])
}

// diagRequest is the netlink message asking for one TCP socket.
func diagRequest(sport, dport int, src, dst net.IP) []byte {
	b := make([]byte, nlmsgHdrLen+inetDiagReqV2Len)
	le := binary.LittleEndian // netlink headers are in host order (amd64, arm64: little-endian)
	le.PutUint32(b[0:], uint32(len(b)))
	le.PutUint16(b[4:], sockDiagByFamily)
	le.PutUint16(b[6:], syscall.NLM_F_REQUEST)
	r := b[nlmsgHdrLen:]
	r[0], r[1] = syscall.AF_INET, syscall.IPPROTO_TCP
	le.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8 : 8+inetDiagSockIDLen]
	binary.BigEndian.PutUint16(id[0:], uint16(sport))
	binary.BigEndian.PutUint16(id[2:], uint16(dport))
	copy(id[4:8], src)
	copy(id[20:24], dst)
	le.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	le.PutUint32(id[44:], 0xffffffff)
	return b
}

// diagAnswer reads the inode out of the kernel's answer.
func diagAnswer(b []byte) (uint64, error) {
	le := binary.LittleEndian
	if len(b) < nlmsgHdrLen {
		return 0, errors.New("clustertest: sock_diag: short answer")
	}
	switch le.Uint16(b[4:]) {
	case sockDiagByFamily:
	case nlmsgError:
		if len(b) >= nlmsgHdrLen+4 {
			if errno := int32(le.Uint32(b[nlmsgHdrLen:])); errno != 0 {
				return 0, fmt.Errorf("clustertest: sock_diag: %w", syscall.Errno(-errno))
			}
		}
		return 0, errors.New("clustertest: sock_diag: no such socket")
	default:
		return 0, fmt.Errorf("clustertest: sock_diag: answer of type %d", le.Uint16(b[4:]))
	}
	m := b[nlmsgHdrLen:]
	if len(m) < inetDiagMsgLen {
		return 0, errors.New("clustertest: sock_diag: short message")
	}
	return uint64(le.Uint32(m[inetDiagInodeOff:])), nil
}
