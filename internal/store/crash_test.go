package store

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// The kill -9 test re-executes the test binary as a child that appends
// to a real log and prints each confirmed record; the parent kills it
// with SIGKILL mid-append, reopens the log and checks that every
// confirmed record is there.
const (
	crashChildEnv = "COURIER_STORE_CRASH_CHILD" // the log directory
	crashRoundEnv = "COURIER_STORE_CRASH_ROUND"
)

func crashOptions() Options {
	o := DefaultOptions()
	o.SegmentSize = 256 << 10 // roll over and delete often
	o.MaxRecordSize = 4 << 10
	return o
}

// crashChild is the child: it appends from 8 goroutines until killed,
// printing "ok <id> <seg> <off> <len>" once a record is durable. It
// checkpoints now and then and releases a third of its records, printing
// "rel <id>" before it does, so that deletion runs under the kill too.
func crashChild() {
	dir := os.Getenv(crashChildEnv)
	round, _ := strconv.Atoi(os.Getenv(crashRoundEnv))
	l, rec, err := Open(OSFS{}, dir, crashOptions())
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		os.Exit(2)
	}
	fmt.Fprintf(os.Stderr, "child round %d: recovered %+v\n", round, rec)
	if err := l.Replay(func(Record) error { return nil }); err != nil {
		fmt.Fprintln(os.Stderr, "child: replay:", err)
		os.Exit(2)
	}
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		fmt.Fprintf(os.Stdout, format, args...) // unbuffered: on the pipe before the kill
		outMu.Unlock()
	}
	toRelease := make(chan [2]int64, 1<<16)
	go func() {
		for r := range toRelease {
			ref := refFromKey(r[1])
			say("rel %d\n", r[0])
			if err := l.Release(uint32(r[0]%7), []Ref{ref}, nil); err != nil {
				fmt.Fprintln(os.Stderr, "child: release:", err)
				os.Exit(2)
			}
		}
	}()
	for g := range 8 {
		go func() {
			for i := 0; ; i++ {
				id := round*10_000_000 + g*1_000_000 + i
				ready := make(chan Ref, 1)
				ref, err := l.Append(uint32(id%7), 1, payloadFor(id), func(err error) {
					if err != nil {
						fmt.Fprintln(os.Stderr, "child: done:", err)
						os.Exit(2)
					}
					ref := <-ready
					say("ok %d %d %d %d\n", id, ref.Seg, ref.Off, ref.Len)
					if id%3 == 0 {
						select {
						case toRelease <- [2]int64{int64(id), refKey(ref)}:
						default:
						}
					}
				})
				if err != nil {
					fmt.Fprintln(os.Stderr, "child: append:", err)
					os.Exit(2)
				}
				ready <- ref
				if g == 0 && i%500 == 499 {
					if _, err := l.Checkpoint(func(Pos) ([]byte, error) { return []byte("child"), nil }); err != nil {
						fmt.Fprintln(os.Stderr, "child: checkpoint:", err)
						os.Exit(2)
					}
				}
			}
		}()
	}
	select {}
}

// refKey packs a ref for a channel: segment, offset and length fit 64
// bits here (offsets under 2^20, lengths under 2^12).
func refKey(r Ref) int64 { return int64(r.Seg)<<32 | int64(r.Off)<<12 | int64(r.Len) }
func refFromKey(k int64) Ref {
	return Ref{Pos: Pos{Seg: uint32(k >> 32), Off: uint32(k>>12) & (1<<20 - 1)}, Len: uint32(k & (1<<12 - 1))}
}

func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	dir := t.TempDir()
	confirmed := map[int]Ref{}
	released := map[int]bool{}
	rng := rand.New(rand.NewPCG(3, 4))
	const rounds = 4
	for round := range rounds {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+dir, fmt.Sprintf("%s=%d", crashRoundEnv, round))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		target := 2000 + rng.IntN(8000)
		n, killed := 0, false
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 5 && f[0] == "ok":
				var v [4]uint64
				for i := range v {
					v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
				}
				confirmed[int(v[0])] = Ref{Pos: Pos{Seg: uint32(v[1]), Off: uint32(v[2])}, Len: uint32(v[3])}
				n++
			case len(f) == 2 && f[0] == "rel":
				id, _ := strconv.Atoi(f[1])
				released[id] = true
			default:
				t.Fatalf("child printed %q", sc.Text())
			}
			if n >= target && !killed {
				if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
					t.Fatal(err)
				}
				killed = true
			}
		}
		err = cmd.Wait()
		var ee *exec.ExitError
		if !killed || !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("round %d: child ended with %v after %d confirms; stderr:\n%s", round, err, n, stderr.String())
		}
		t.Logf("round %d: killed after %d confirmed appends (%s)", round, n, strings.TrimSpace(stderr.String()))
	}

	l, rec := mustOpen(t, OSFS{}, dir, crashOptions())
	t.Logf("final recovery: %+v", rec)
	checked := 0
	for id, ref := range confirmed {
		if released[id] {
			continue
		}
		r, err := l.Read(ref, nil)
		if err != nil {
			t.Fatalf("confirmed record %d at %v lost: %v", id, ref, err)
		}
		if !bytes.Equal(r.Payload, payloadFor(id)) || r.Queue != uint32(id%7) {
			t.Fatalf("confirmed record %d at %v: wrong contents", id, ref)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no confirmed record to check")
	}
	t.Logf("%d confirmed records checked after %d kills (%d released)", checked, rounds, len(released))
}
