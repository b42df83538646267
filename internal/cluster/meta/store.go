package meta

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	bolt "go.etcd.io/bbolt"
)

// boltStore is Raft's log and stable store in one bbolt file, synced on
// every commit. raft-boltdb/v2 v2.3.1 would do the same, but it imports a
// go-metrics package (compat) that the go-metrics raft v1.8.0 needs no
// longer has, so the two cannot be built together.
type boltStore struct {
	db *bolt.DB
	// mu and closed make writes after Close no-ops (see closingStream):
	// writes hold mu for reading, Close for writing.
	mu     sync.RWMutex
	closed bool
}

var (
	bucketLogs   = []byte("logs")
	bucketStable = []byte("stable")
)

// maxLogEntry bounds one log entry read back from the file: the commands
// of the metadata group are far smaller (maxFrame), and a corrupted
// length must not make the node allocate gigabytes.
const maxLogEntry = 8 << 20

var errCorruptLog = errors.New("meta: corrupt log entry")

func openBoltStore(path string) (*boltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("meta: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLogs, bucketStable} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("meta: init %s: %w", path, err)
	}
	return &boltStore{db: db}, nil
}

// Close closes the file once the writes under way are done. A write that
// comes later is dropped and reports success: only a heartbeat handled
// in hashicorp/raft's transport after Raft's shutdown does that (raft
// panics on a failed term write), and its answer cannot reach the leader
// because Meta.Shutdown closed its connection first.
func (s *boltStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.db.Close()
}

// update runs fn in a write transaction, unless the store is closed.
func (s *boltStore) update(fn func(*bolt.Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil
	}
	return s.db.Update(fn)
}

func key(i uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], i)
	return b[:]
}

// FirstIndex returns the first index written, 0 for none.
func (s *boltStore) FirstIndex() (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketLogs).Cursor().First(); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// LastIndex returns the last index written, 0 for none.
func (s *boltStore) LastIndex() (uint64, error) {
	var i uint64
	err := s.db.View(func(tx *bolt.Tx) error {
		if k, _ := tx.Bucket(bucketLogs).Cursor().Last(); k != nil {
			i = binary.BigEndian.Uint64(k)
		}
		return nil
	})
	return i, err
}

// GetLog reads the entry at index into log.
func (s *boltStore) GetLog(index uint64, log *raft.Log) error {
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketLogs).Get(key(index))
		if v == nil {
			return raft.ErrLogNotFound
		}
		return decodeLog(v, log)
	})
}

// StoreLog stores one entry.
func (s *boltStore) StoreLog(log *raft.Log) error { return s.StoreLogs([]*raft.Log{log}) }

// StoreLogs stores entries in one synced transaction.
func (s *boltStore) StoreLogs(logs []*raft.Log) error {
	return s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLogs)
		for _, l := range logs {
			if err := b.Put(key(l.Index), encodeLog(l)); err != nil {
				return err
			}
		}
		return nil
	})
}

// DeleteRange deletes the entries from min to max, both included.
func (s *boltStore) DeleteRange(min, max uint64) error {
	return s.update(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketLogs).Cursor()
		for k, _ := c.Seek(key(min)); k != nil && binary.BigEndian.Uint64(k) <= max; k, _ = c.Next() {
			if err := c.Delete(); err != nil {
				return err
			}
		}
		return nil
	})
}

// Set stores a value of the stable store.
func (s *boltStore) Set(k, v []byte) error {
	return s.update(func(tx *bolt.Tx) error { return tx.Bucket(bucketStable).Put(k, v) })
}

// Get reads a value of the stable store: nil if absent, as raft expects
// an error "not found" only by message.
func (s *boltStore) Get(k []byte) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketStable).Get(k); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	if err == nil && out == nil {
		return nil, errors.New("not found")
	}
	return out, err
}

// SetUint64 stores a number of the stable store.
func (s *boltStore) SetUint64(k []byte, v uint64) error { return s.Set(k, key(v)) }

// GetUint64 reads a number of the stable store, 0 if absent.
func (s *boltStore) GetUint64(k []byte) (uint64, error) {
	v, err := s.Get(k)
	if err != nil {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: stable value %q has %d bytes", errCorruptLog, k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// Log encoding: index, term (8 bytes each), type (1), appended-at in
// Unix nanoseconds (8), then data and extensions, each a 4-byte length
// and its bytes.
const logHeader = 8 + 8 + 1 + 8

func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, logHeader+8+len(l.Data)+len(l.Extensions))
	b = binary.BigEndian.AppendUint64(b, l.Index)
	b = binary.BigEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Extensions)))
	return append(b, l.Extensions...)
}

func decodeLog(v []byte, l *raft.Log) error {
	if len(v) < logHeader+8 || len(v) > maxLogEntry {
		return fmt.Errorf("%w: %d bytes", errCorruptLog, len(v))
	}
	l.Index = binary.BigEndian.Uint64(v)
	l.Term = binary.BigEndian.Uint64(v[8:])
	l.Type = raft.LogType(v[16])
	if at := int64(binary.BigEndian.Uint64(v[17:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	} else {
		l.AppendedAt = time.Time{}
	}
	rest := v[logHeader:]
	var err error
	if l.Data, rest, err = chunk(rest); err != nil {
		return err
	}
	if l.Extensions, rest, err = chunk(rest); err != nil {
		return err
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", errCorruptLog, len(rest))
	}
	return nil
}

// chunk reads a 4-byte length and that many bytes, copied out of bbolt's
// memory map (valid only inside the transaction).
func chunk(b []byte) (data, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%w: short", errCorruptLog)
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: length %d past the end", errCorruptLog, n)
	}
	if n == 0 {
		return nil, b, nil
	}
	return append([]byte(nil), b[:n]...), b[n:], nil
}
