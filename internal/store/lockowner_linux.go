//go:build linux

package store

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// lockHolder finds in /proc/locks the process that holds an flock(2) on
// f; 0 when it is not found.
func lockHolder(f *os.File) int {
	fi, err := f.Stat()
	if err != nil {
		return 0
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	dev := uint64(st.Dev)
	major := (dev>>8)&0xfff | (dev>>32)&^0xfff
	minor := dev&0xff | (dev>>12)&^0xff
	id := fmt.Sprintf("%02x:%02x:%d", major, minor, st.Ino)
	locks, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer locks.Close()
	// "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; lines are short,
	// and the table is read to its end at most once (bounded by 4 MiB).
	sc := bufio.NewScanner(io.LimitReader(locks, 4<<20))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || fields[1] != "FLOCK" || fields[5] != id {
			continue
		}
		if pid, err := strconv.Atoi(fields[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}
