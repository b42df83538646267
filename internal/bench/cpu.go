package bench

import (
	"fmt"
	"os"
	"time"
)

// cpuMeter samples the CPU time of the broker's process and of this one.
type cpuMeter struct {
	// embedded: the broker runs in this process; only the whole
	// process's CPU can be told.
	embedded bool
	pid      int    // the broker's process, 0 if unknown
	name     string // its command name
	why      string // why pid is unknown
}

func newCPUMeter(cfg *Config) *cpuMeter {
	m := &cpuMeter{}
	switch {
	case cfg.ServerPID != 0:
		m.pid = cfg.ServerPID
	case cfg.Target.Kind == KindEmbedded:
		m.embedded = true
		m.pid = os.Getpid()
	case !cfg.Target.local():
		m.why = "the server is not on this machine (use --server-pid)"
	default:
		port, err := cfg.Target.port()
		if err == nil {
			m.pid, err = listenerPID(port)
		}
		if err != nil {
			m.why = err.Error()
		}
	}
	if m.pid != 0 {
		if _, err := procCPU(m.pid); err != nil {
			m.why, m.pid = err.Error(), 0
		} else {
			m.name = procName(m.pid)
		}
	}
	if m.pid == os.Getpid() {
		m.embedded = true
	}
	return m
}

// cpuSample is a reading of both processes' CPU time.
type cpuSample struct {
	broker time.Duration // -1 if unknown
	client time.Duration
}

func (m *cpuMeter) sample() cpuSample {
	s := cpuSample{broker: -1, client: selfCPU()}
	if m.embedded {
		s.broker = s.client
	} else if m.pid != 0 {
		if d, err := procCPU(m.pid); err == nil {
			s.broker = d
		}
	}
	return s
}

// CPU is the CPU time spent over a run, in microseconds per cycle (or per
// delivered message in pub-sub).
type CPU struct {
	// Broker is the broker process's; with an embedded node, the whole
	// process's (broker and clients), and the same as Client. -1: unknown.
	Broker float64 `json:"broker_us"`
	// Client is this process's: the requesters and the handler, or the
	// publisher and subscribers.
	Client float64 `json:"client_us"`
}

func (m *cpuMeter) per(from, to cpuSample, n int64) CPU {
	c := CPU{Broker: -1}
	if n <= 0 {
		return c
	}
	if from.broker >= 0 && to.broker >= 0 {
		c.Broker = float64(to.broker-from.broker) / float64(time.Microsecond) / float64(n)
	}
	c.Client = float64(to.client-from.client) / float64(time.Microsecond) / float64(n)
	return c
}

// Process describes the broker's process for reports.
type Process struct {
	PID int `json:"pid,omitempty"`
	// Name is its command name, such as "nats-server" or "beam.smp".
	Name string `json:"name,omitempty"`
	// Embedded: the broker runs inside the benchmarking process, so its
	// CPU figures are the whole process's.
	Embedded bool `json:"embedded"`
	// RSS and PeakRSS are its resident memory at the end of the run and
	// its peak over its life, in bytes.
	RSS     int64 `json:"rss_bytes,omitempty"`
	PeakRSS int64 `json:"peak_rss_bytes,omitempty"`
	// Unknown tells why the broker's figures are missing.
	Unknown string `json:"unknown,omitempty"`
}

func (m *cpuMeter) process() Process {
	p := Process{PID: m.pid, Name: m.name, Embedded: m.embedded, Unknown: m.why}
	if m.pid != 0 {
		p.RSS, p.PeakRSS, _ = procMem(m.pid)
	}
	return p
}

// describe returns the text lines about the broker's CPU and memory.
func (p Process) describe(total CPU, unit string) []string {
	mb := func(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/1e6) }
	switch {
	case p.Embedded:
		return []string{
			fmt.Sprintf("Process CPU %.1f us/%s (broker in this process: broker and clients together, pid %d), RSS %s (peak %s)",
				total.Client, unit, p.PID, mb(p.RSS), mb(p.PeakRSS)),
		}
	case p.PID != 0:
		return []string{
			fmt.Sprintf("Broker CPU %.1f us/%s (%s pid %d, utime+stime), RSS %s (peak %s)",
				total.Broker, unit, p.Name, p.PID, mb(p.RSS), mb(p.PeakRSS)),
			fmt.Sprintf("Client CPU %.1f us/%s (this process)", total.Client, unit),
		}
	}
	return []string{
		fmt.Sprintf("Broker CPU unknown: %s", p.Unknown),
		fmt.Sprintf("Client CPU %.1f us/%s (this process)", total.Client, unit),
	}
}
