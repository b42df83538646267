package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat. USER_HZ
// is 100 on every Linux architecture Go supports; the kernel keeps it
// fixed for user space whatever its internal HZ.
const clockTick = 10 * time.Millisecond

// errNoProc is returned where /proc cannot answer (not Linux, or the
// process is not visible).
var errNoProc = errors.New("bench: no /proc entry")

// procCPU returns the user plus system CPU time a process has used, all
// threads included, from /proc/<pid>/stat. Its resolution is 10 ms.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errNoProc, err)
	}
	// The command name, field 2, is in parentheses and may hold spaces
	// and parentheses: the fields that follow start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: /proc/%d/stat: bad utime/stime %q %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * clockTick, nil
}

// selfCPU returns this process's user plus system CPU time, to the
// microsecond (getrusage).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procMem returns a process's resident set size and its peak (VmRSS and
// VmHWM of /proc/<pid>/status), in bytes.
func procMem(pid int) (rss, peak int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v", errNoProc, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		fs := strings.Fields(v) // "12345 kB"
		if len(fs) == 0 {
			continue
		}
		n, err := strconv.ParseInt(fs[0], 10, 64)
		if err != nil {
			continue
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			peak = n << 10
		}
	}
	return rss, peak, nil
}

// procName returns a process's command name (/proc/<pid>/comm).
func procName(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// listenerPID finds the process listening on a TCP port: the socket's
// inode from /proc/net/tcp and tcp6 (state 0A, LISTEN), then the process
// with a file descriptor linked to "socket:[inode]". It needs permission
// to read the other process's /proc/<pid>/fd (root, or the same user).
func listenerPID(port int) (int, error) {
	inodes := map[string]bool{}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(name)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if !ok {
				continue
			}
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if err != nil || int(p) != port || f[9] == "0" {
				continue
			}
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("bench: no process listens on TCP port %d here", port)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil {
			continue
		}
		fds, err := os.ReadDir(dir + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(dir + "/fd/" + fd.Name())
			if err == nil && inodes[link] {
				return pid, nil
			}
		}
	}
	return 0, fmt.Errorf("bench: port %d listens, but its process is not visible (use --server-pid)", port)
}
