package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
)

// Argon2id parameters of new hashes: OWASP's recommended minimum
// (19 MiB, 2 passes, 1 lane), which keeps a login near 20-40 ms of one
// core. Stored hashes carry their own parameters, so these can grow
// without invalidating existing passwords.
const (
	argonMemory  = 19 * 1024 // KiB
	argonTime    = 2
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// Bounds on the parameters of a stored hash: a users file edited by hand
// must not make one login cost gigabytes or minutes.
const (
	maxArgonMemory  = 256 * 1024 // KiB
	maxArgonTime    = 16
	maxArgonThreads = 16
)

// MaxPassword bounds a password's length in bytes.
const MaxPassword = 1024

var b64 = base64.RawStdEncoding

// HashPassword returns the argon2id hash of password in the PHC string
// format: $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>, salt and hash in
// unpadded base64.
func HashPassword(password string) (string, error) {
	if err := checkPassword(password); err != nil {
		return "", err
	}
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("auth: salt: %w", err)
	}
	key := argon2.IDKey([]byte(password), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemory, argonTime, argonThreads, b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

func checkPassword(password string) error {
	if password == "" {
		return fmt.Errorf("%w: the password is empty", ErrBadPassword)
	}
	if len(password) > MaxPassword {
		return fmt.Errorf("%w: the password has more than %d bytes", ErrBadPassword, MaxPassword)
	}
	return nil
}

// argonHash is a parsed PHC string.
type argonHash struct {
	memory, time uint32
	threads      uint8
	salt, key    []byte
}

// parseHash parses and bounds a PHC argon2id string.
func parseHash(s string) (argonHash, error) {
	var h argonHash
	parts := strings.Split(s, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" {
		return h, fmt.Errorf("%w: not an argon2id hash in PHC form ($argon2id$v=19$m=...,t=...,p=...$salt$hash)", ErrBadHash)
	}
	var v int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &v); err != nil || v != argon2.Version {
		return h, fmt.Errorf("%w: argon2 version %q, want v=%d", ErrBadHash, parts[2], argon2.Version)
	}
	var m, t, p uint32
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return h, fmt.Errorf("%w: parameters %q: %v", ErrBadHash, parts[3], err)
	}
	if m < 8*p || m > maxArgonMemory || t < 1 || t > maxArgonTime || p < 1 || p > maxArgonThreads {
		return h, fmt.Errorf("%w: parameters %q out of bounds (m ≤ %d KiB, t ≤ %d, p ≤ %d)", ErrBadHash, parts[3], maxArgonMemory, maxArgonTime, maxArgonThreads)
	}
	salt, err := b64.DecodeString(parts[4])
	if err != nil || len(salt) < 8 {
		return h, fmt.Errorf("%w: bad salt", ErrBadHash)
	}
	key, err := b64.DecodeString(parts[5])
	if err != nil || len(key) < 16 || len(key) > 128 {
		return h, fmt.Errorf("%w: bad hash value", ErrBadHash)
	}
	return argonHash{memory: m, time: t, threads: uint8(p), salt: salt, key: key}, nil
}

// verify reports whether password matches h, in time independent of
// where they differ.
func (h argonHash) verify(password string) bool {
	key := argon2.IDKey([]byte(password), h.salt, h.time, h.memory, h.threads, uint32(len(h.key)))
	return subtle.ConstantTimeCompare(key, h.key) == 1
}

// CheckHash reports whether s is a usable argon2id PHC string.
func CheckHash(s string) error {
	_, err := parseHash(s)
	return err
}
