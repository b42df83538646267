package broker

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
)

// Node names and the ids users see.
//
// A connection id is the node's name, '/', 'c' and the connection's
// number on that node: "n2/c7". From the node's second start on its data
// directory, the number is qualified by the start (the boot count, kept
// in the data directory by the node): "n2/c3-7" is connection 7 of the
// third start of n2. A member id is its connection id, '.' and the
// attachment's id: "n2/c7.2". Node names have no '/', '.' or '@', so an
// id splits unambiguously: the node before the first '/', the
// attachment after the last '.'.

// MaxNodeName bounds the length of a node name, in bytes.
const MaxNodeName = 64

// ValidNodeName reports whether name can name a node: 1 to
// [MaxNodeName] ASCII letters, digits, '-' and '_', the first a letter
// or a digit.
func ValidNodeName(name string) bool {
	if name == "" || len(name) > MaxNodeName || !alnum(name[0]) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !alnum(c) && c != '-' && c != '_' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// NewNodeName returns a fresh node name: the host's short name (up to
// its first '.', lower-cased, other characters than letters, digits,
// '-' and '_' made '-'), '-' and four random hexadecimal digits, such as
// "web1-3fa2"; "node-3fa2" when the host has no usable name. Two calls
// give different names with a probability of 1 - 1/65536 on one host.
func NewNodeName() string {
	host, _ := os.Hostname()
	return nodeNameFrom(host, randomHex(2))
}

// nodeNameFrom builds a node name from a host name and a suffix.
func nodeNameFrom(host, suffix string) string {
	host, _, _ = strings.Cut(strings.ToLower(host), ".")
	b := []byte(host)
	for i, c := range b {
		if !alnum(c) && c != '-' && c != '_' {
			b[i] = '-'
		}
	}
	host = strings.TrimLeft(string(b), "-_")
	host = strings.TrimRight(host[:min(len(host), MaxNodeName-1-len(suffix))], "-_")
	if host == "" {
		host = "node"
	}
	return host + "-" + suffix
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// connID returns the id of connection n of node's boot-th start.
func connID(node string, boot, n uint64) string {
	b := make([]byte, 0, len(node)+24)
	b = append(b, node...)
	b = append(b, "/c"...)
	if boot > 1 {
		b = strconv.AppendUint(b, boot, 10)
		b = append(b, '-')
	}
	return string(strconv.AppendUint(b, n, 10))
}

// parseConnID returns the node and the connection number of a connection
// id, and whether id is one as [connID] writes them.
func parseConnID(id string) (node string, n uint64, ok bool) {
	node, rest, ok := strings.Cut(id, "/c")
	if !ok || !ValidNodeName(node) {
		return "", 0, false
	}
	if boot, num, qualified := strings.Cut(rest, "-"); qualified {
		if b, ok := parseNumber(boot); !ok || b < 2 {
			return "", 0, false
		}
		rest = num
	}
	n, ok = parseNumber(rest)
	return node, n, ok
}

// parseNumber parses a positive decimal number written without a sign or
// leading zeros.
func parseNumber(s string) (uint64, bool) {
	if s == "" || s[0] == '0' {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// NodeOf returns the node of a connection or member id, such as "n2" for
// "n2/c7.2", or "" if id names no node.
func NodeOf(id string) string {
	node, _, ok := strings.Cut(id, "/")
	if !ok || !ValidNodeName(node) {
		return ""
	}
	return node
}
