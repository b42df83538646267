package node

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ByteSize is a number of bytes that reads from text with a unit, as in
// the configuration file: "64MiB", "2GB", "512k", "1073741824", or a
// share of the machine's memory, "40%".
type ByteSize int64

var byteUnits = []struct {
	suffix string
	mul    int64
}{
	{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"TIB", 1 << 40},
	{"KB", 1000}, {"MB", 1000_000}, {"GB", 1000_000_000}, {"TB", 1000_000_000_000},
	{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1},
}

// ParseByteSize reads a size: a number with an optional unit (k, M, G,
// T: powers of 1024, as are KiB, MiB...; KB, MB, GB: powers of 1000), a
// percentage of the machine's memory, or -1 (also "none" or "off"), which
// the settings that take a size read as "none" or "no check".
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	switch strings.ToLower(t) {
	case "-1", "none", "off":
		return -1, nil
	}
	if p, ok := strings.CutSuffix(t, "%"); ok {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || f <= 0 || f > 100 {
			return 0, fmt.Errorf("bad size %q: a percentage is from 0 to 100", s)
		}
		total := MachineMemory()
		if total <= 0 {
			return 0, fmt.Errorf("bad size %q: the machine's memory is unknown here", s)
		}
		return ByteSize(float64(total) * f / 100), nil
	}
	mul := int64(1)
	up := strings.ToUpper(t)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(up, u.suffix); ok {
			up, mul = strings.TrimSpace(num), u.mul
			break
		}
	}
	f, err := strconv.ParseFloat(up, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad size %q: want a number of bytes with an optional unit, such as 64MiB, a percentage, or -1 for none", s)
	}
	return ByteSize(f * float64(mul)), nil
}

// UnmarshalText reads a size from the configuration file.
func (b *ByteSize) UnmarshalText(p []byte) error {
	v, err := ParseByteSize(string(p))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// String formats the size with a binary unit.
func (b ByteSize) String() string {
	v := int64(b)
	if v <= 0 {
		return strconv.FormatInt(v, 10)
	}
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v >= u.m && v%(u.m/1024) == 0 {
			return strconv.FormatFloat(float64(v)/float64(u.m), 'f', -1, 64) + u.s
		}
	}
	return strconv.FormatInt(v, 10) + "B"
}

// Set and Type make a ByteSize a command-line flag (pflag.Value).
func (b *ByteSize) Set(s string) error { return b.UnmarshalText([]byte(s)) }

// Type names the flag's type in help texts.
func (b *ByteSize) Type() string { return "size" }

// DefaultMemoryBudget is the default [Config.MemoryBudget]: what durable
// queues keep in RAM before they page. A server with it holds under 100
// MB of RSS however deep its queues (docs/queues.md, "Figures").
const DefaultMemoryBudget ByteSize = 32 << 20

// DefaultMemoryShare is the share of the machine's memory the default
// [Config.MemoryHighWatermark] takes.
const DefaultMemoryShare = 0.4

// noWatermark is the limit of a budget without a high watermark: never
// reached.
const noWatermark = 1 << 62

// MachineMemory returns the memory the process may use: the machine's,
// or its cgroup's limit if lower; 0 if unknown.
func MachineMemory() int64 {
	var total int64
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				total = kb << 10
				break
			}
		}
		f.Close()
	}
	if p, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if lim, err := strconv.ParseInt(strings.TrimSpace(string(p)), 10, 64); err == nil && lim > 0 && (total == 0 || lim < total) {
			total = lim
		}
	}
	return total
}

// defaultHighWatermark is DefaultMemoryShare of the machine's memory, or
// 1 GiB if that is unknown.
func defaultHighWatermark() ByteSize {
	if m := MachineMemory(); m > 0 {
		return ByteSize(float64(m) * DefaultMemoryShare)
	}
	return 1 << 30
}

// memorySizes returns the limit (the high watermark) and the budget of a
// node's queues from its configuration (defaults applied; -1 is none): a
// watermark under the budget is raised to it; without a budget, queues
// page from half the watermark; without either, limit is 0 (no budget).
func memorySizes(budget, watermark ByteSize) (limit, pageBudget int64) {
	switch {
	case budget <= 0 && watermark <= 0:
		return 0, 0
	case watermark <= 0:
		return noWatermark, int64(budget)
	case budget <= 0:
		return int64(watermark), int64(watermark)
	}
	return int64(max(watermark, budget)), int64(budget)
}

// GoMemoryLimit is the soft memory limit `courier server` gives the Go
// runtime (debug.SetMemoryLimit) for a node with this
// [Config.MemoryBudget] and [Config.MemoryHighWatermark] (0: the
// default), unless GOMEMLIMIT sets one: 1.5 × the watermark + 32 MiB; 0
// for none.
func GoMemoryLimit(budget, watermark ByteSize) int64 {
	setDefault(&budget, DefaultMemoryBudget)
	if watermark == 0 {
		watermark = defaultHighWatermark()
	}
	limit, _ := memorySizes(budget, watermark)
	if limit <= 0 || limit == noWatermark {
		return 0
	}
	return limit + limit/2 + 32<<20
}
