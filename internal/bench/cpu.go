package bench

import (
	"fmt"
	"os"
	"runtime"
	"slices"
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
	// others are the processes of the cluster's other servers the run
	// uses (HandlerURL, SubscriberURLs), whose figures add to pid's.
	others []int
}

func newCPUMeter(cfg *Config) *cpuMeter {
	m := &cpuMeter{}
	switch {
	case cfg.ServerPID != 0:
		m.pid = cfg.ServerPID
	case cfg.Target.Kind == KindEmbedded || cfg.Target.Kind == KindEcho:
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
		m.others = otherPIDs(cfg, m.pid)
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
			for _, pid := range m.others {
				d, _ := procCPU(pid) // 0 once it is gone
				s.broker += d
			}
		}
	}
	return s
}

// otherPIDs returns the processes listening on the ports of the run's
// other servers on this machine, without first and repeats. A server
// whose process is not found is left out (its figures are not summed).
func otherPIDs(cfg *Config, first int) []int {
	var out []int
	for _, raw := range cfg.serverURLs()[1:] {
		t, err := ParseTarget(raw)
		if err != nil || !t.local() {
			continue
		}
		port, err := t.port()
		if err != nil {
			continue
		}
		pid, err := listenerPID(port)
		if err == nil && pid != first && !slices.Contains(out, pid) {
			out = append(out, pid)
		}
	}
	return out
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

// rss returns the broker's resident memory now, in bytes; 0 if unknown.
func (m *cpuMeter) rss() int64 {
	if m.pid == 0 {
		return 0
	}
	rss, _ := m.mem()
	return rss
}

// mem returns the resident memory and its peak of the broker's
// processes together, in bytes.
func (m *cpuMeter) mem() (rss, peak int64) {
	for _, pid := range append([]int{m.pid}, m.others...) {
		r, p, _ := procMem(pid)
		rss += r
		peak += p
	}
	return rss, peak
}

// Usage is what the server and this process used over a measured run.
type Usage struct {
	// Seconds is the run's wall-clock time.
	Seconds float64 `json:"seconds"`
	// ServerCPUSeconds is the server process's user plus system time; -1
	// when unknown. For an embedded node it is the whole process's, the
	// same as ClientCPUSeconds.
	ServerCPUSeconds float64 `json:"server_cpu_s"`
	// ServerPeakRSS is the highest resident memory of the server seen
	// during the run (sampled every interval and at the ends), and
	// ServerHWM its peak over the process's life (VmHWM), in bytes; 0
	// when unknown.
	ServerPeakRSS int64 `json:"server_peak_rss_bytes"`
	ServerHWM     int64 `json:"server_hwm_bytes"`
	// ClientCPUSeconds is this process's CPU time: the load generator
	// (and, embedded, the broker too).
	ClientCPUSeconds float64 `json:"client_cpu_s"`
	// Cores is the number of CPUs this process may use (GOMAXPROCS).
	Cores int `json:"cores"`
}

func (m *cpuMeter) usage(from, to cpuSample, wall time.Duration, peakRSS int64) Usage {
	u := Usage{
		Seconds:          wall.Seconds(),
		ServerCPUSeconds: -1,
		ClientCPUSeconds: (to.client - from.client).Seconds(),
		Cores:            runtime.GOMAXPROCS(0),
	}
	if from.broker >= 0 && to.broker >= 0 {
		u.ServerCPUSeconds = (to.broker - from.broker).Seconds()
	}
	if m.pid != 0 {
		var rss int64
		rss, u.ServerHWM = m.mem()
		u.ServerPeakRSS = max(peakRSS, rss)
	}
	return u
}

// ClientCores is the average number of cores this process kept busy.
func (u Usage) ClientCores() float64 {
	if u.Seconds <= 0 {
		return 0
	}
	return u.ClientCPUSeconds / u.Seconds
}

// lines describes the usage for reports: the server's CPU seconds and
// memory, and the client's CPU with a warning when it may have been the
// bottleneck.
func (u Usage) lines(p Process) []string {
	mb := func(b int64) string { return fmt.Sprintf("%.0f MB", float64(b)/1e6) }
	var out []string
	switch {
	case p.Embedded:
		out = append(out, fmt.Sprintf("Process (broker and load generator together): CPU %.2f s over %.1f s (%.2f cores), peak RSS %s during the run",
			u.ClientCPUSeconds, u.Seconds, u.ClientCores(), mb(u.ServerPeakRSS)))
		return out
	case u.ServerCPUSeconds >= 0:
		label := "Server"
		if len(p.Others) > 0 {
			label = fmt.Sprintf("Servers (%d processes, summed)", 1+len(p.Others))
		}
		out = append(out, fmt.Sprintf("%s: CPU %.2f s over %.1f s (%.2f cores), peak RSS %s during the run (%s over its life)", label,
			u.ServerCPUSeconds, u.Seconds, u.ServerCPUSeconds/max(u.Seconds, 1e-9), mb(u.ServerPeakRSS), mb(u.ServerHWM)))
	default:
		out = append(out, "Server: CPU and memory unknown: "+p.Unknown)
	}
	out = append(out, fmt.Sprintf("Client: CPU %.2f s (%.2f of %d cores)", u.ClientCPUSeconds, u.ClientCores(), u.Cores))
	server := max(u.ServerCPUSeconds, 0) / max(u.Seconds, 1e-9)
	if u.Cores > 0 && u.ClientCores()+server >= 0.9*float64(u.Cores) && u.ClientCores() >= server {
		out = append(out, "Warning: the machine's cores were busy and the load generator used more CPU than the server: it may be the bottleneck (compare with courier-bench echo)")
	}
	return out
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
	// Others are the processes of the other servers of a cluster the
	// run used; the CPU and memory figures are the sum over PID and
	// them.
	Others []int `json:"other_pids,omitempty"`
}

func (m *cpuMeter) process() Process {
	p := Process{PID: m.pid, Name: m.name, Embedded: m.embedded, Unknown: m.why, Others: m.others}
	if m.pid != 0 {
		p.RSS, p.PeakRSS = m.mem()
	}
	return p
}

// pids describes the broker's processes: "pid 12" or "pids 12, 13, 14
// summed".
func (p Process) pids() string {
	if len(p.Others) == 0 {
		return fmt.Sprintf("pid %d", p.PID)
	}
	s := fmt.Sprintf("pids %d", p.PID)
	for _, o := range p.Others {
		s += fmt.Sprintf(", %d", o)
	}
	return s + " summed"
}

// describe returns the text lines about the CPU time spent per unit of
// work (cycle, delivery).
func (p Process) describe(total CPU, unit string) []string {
	client := fmt.Sprintf("Client CPU %.1f us/%s (this process)", total.Client, unit)
	switch {
	case p.Embedded:
		return []string{fmt.Sprintf("Process CPU %.1f us/%s (broker in this process: broker and clients together, pid %d)",
			total.Client, unit, p.PID)}
	case p.PID != 0 && total.Broker >= 0:
		return []string{fmt.Sprintf("Broker CPU %.1f us/%s (%s %s, utime+stime)", total.Broker, unit, p.Name, p.pids()), client}
	}
	return []string{client}
}
