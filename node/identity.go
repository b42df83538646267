package node

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/courier-mq/courier/internal/broker"
)

// IdentityFile is the file of the data directory that records the node
// it belongs to and how often that node started on it:
//
//	{"version": 1, "name": "web1-3fa2", "boot": 3}
//
// The name ties the data directory to its node, as RabbitMQ ties its
// data directory to its node name; the boot count qualifies connection
// ids from the second start on ("web1-3fa2/c3-7"), so that a node never
// gives out an id it gave out before a restart.
const IdentityFile = "node.json"

// identityVersion is the format version of IdentityFile.
const identityVersion = 1

// maxIdentitySize bounds what is read of IdentityFile: it is a few
// dozen bytes, and a file that is not must not cost memory.
const maxIdentitySize = 4096

// identity is IdentityFile's JSON.
type identity struct {
	Version int    `json:"version"`
	Name    string `json:"name"`
	Boot    uint64 `json:"boot"`
}

// claimDataDir reads the identity of the data directory dir, checks that
// it belongs to the node name ("" takes the recorded name, or a fresh
// one from [broker.NewNodeName] for a directory without one), counts
// this start and records it before the node serves anything. It returns
// the node's name and boot count (1 on the first start), and undo, which
// a start that fails before it served anything calls to take its count
// back, so that a start retried at once (`courier server` does so when
// the default management address is taken) keeps the short ids of its
// count.
//
// A directory recorded under another name than an explicit one is
// refused with [ErrDataDirOfAnotherNode]. Two processes that start on
// one directory at once may both count a start; only one of them then
// gets the store's lock and serves, so a boot count is never served
// twice. undo restores the count only while the file still holds what
// this start wrote: a later start's count is never taken back.
func claimDataDir(dir, name string) (_ string, boot uint64, undo func(), _ error) {
	path := filepath.Join(dir, IdentityFile)
	id, found, err := readIdentity(path)
	if err == nil {
		err = checkOwner(dir, id, found, name)
	}
	if err != nil {
		return "", 0, nil, err
	}
	switch {
	case found:
		name = id.Name
	case name == "":
		name = broker.NewNodeName()
	}
	next := identity{Version: identityVersion, Name: name, Boot: id.Boot + 1}
	if err := writeIdentity(path, next); err != nil {
		return "", 0, nil, err
	}
	undo = func() {
		if now, ok, err := readIdentity(path); err != nil || !ok || now != next {
			return
		}
		if found {
			writeIdentity(path, id) // at worst the count stays taken: ids then skip it
		} else {
			os.Remove(path)
		}
	}
	return name, next.Boot, undo, nil
}

// checkDataDir refuses, before anything is written in it, a data
// directory that belongs to another node than name ("" for any), or
// whose identity cannot be read.
func checkDataDir(dir, name string) error {
	id, found, err := readIdentity(filepath.Join(dir, IdentityFile))
	if err != nil {
		return err
	}
	return checkOwner(dir, id, found, name)
}

// checkOwner refuses the identity id of data directory dir, if found,
// for a node called name ("" for any).
func checkOwner(dir string, id identity, found bool, name string) error {
	if !found || name == "" || name == id.Name {
		return nil
	}
	return fmt.Errorf("%w: %s is node %q's, not %q's: start the node as %q (--node %s, or node = %q in the configuration), "+
		"or give node %q a data directory of its own; to rename this node, change \"name\" in %s while it is stopped",
		ErrDataDirOfAnotherNode, dir, id.Name, name, id.Name, id.Name, id.Name, name, filepath.Join(dir, IdentityFile))
}

// readIdentity reads IdentityFile at path; found is false when there is
// none (a new data directory, or one of a version before it).
func readIdentity(path string) (id identity, found bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return identity{}, false, nil
	}
	if err != nil {
		return identity{}, false, fmt.Errorf("node: data directory: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxIdentitySize+1))
	if err != nil {
		return identity{}, false, fmt.Errorf("node: data directory: %w", err)
	}
	bad := func(why string) error {
		return fmt.Errorf("%w: %s: %s; repair it (docs/operations.md, \"Node name\")", ErrBadIdentity, path, why)
	}
	if len(b) > maxIdentitySize {
		return identity{}, false, bad(fmt.Sprintf("over %d bytes", maxIdentitySize))
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&id); err != nil {
		return identity{}, false, bad(err.Error())
	}
	switch {
	case id.Version != identityVersion:
		return identity{}, false, bad(fmt.Sprintf("version %d, want %d", id.Version, identityVersion))
	case !broker.ValidNodeName(id.Name):
		return identity{}, false, bad(fmt.Sprintf("invalid node name %q", id.Name))
	case id.Boot == 0 || id.Boot >= 1<<53:
		return identity{}, false, bad(fmt.Sprintf("boot count %d out of range", id.Boot))
	}
	return id, true, nil
}

// writeIdentity replaces IdentityFile at path atomically and durably: a
// temporary file in the same directory, fsync, rename, fsync of the
// directory. It is readable by its owner only.
func writeIdentity(path string, id identity) (err error) {
	b, _ := json.Marshal(id) // a struct of a string and two numbers
	b = append(b, '\n')
	dir := filepath.Dir(path)
	defer func() {
		if err != nil {
			err = fmt.Errorf("node: record the node in the data directory: %w", err)
		}
	}()
	tmp, err := os.CreateTemp(dir, "."+IdentityFile+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil // renamed; the directory's fsync is best effort where it cannot be opened
	}
	defer d.Close()
	return d.Sync()
}
