package main

import (
	"bufio"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuUse is the CPU spent over one run of the bench: this process's (the
// router, and in the latency runs also the bench's producer and the reader
// of the audit topic) and the machine's, the broker's included. A run whose
// machine was busy near all of its cores was bound by the CPU, not by the
// router's waits: its latency is queueing.
type cpuUse struct {
	ProcessS    float64 `json:"process_cpu_s"`
	PerEventUs  float64 `json:"process_cpu_us_per_event"`
	MachineBusy float64 `json:"machine_busy"` // the share of all cores busy over the run, 0-1; -1 where /proc/stat cannot be read
}

// cpuMark is where a run's CPU accounting starts.
type cpuMark struct {
	proc        time.Duration
	busy, total uint64
	machine     bool
}

// markCPU reads this process's CPU time and the machine's CPU counters.
func markCPU() cpuMark {
	var m cpuMark
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		m.proc = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	m.busy, m.total, m.machine = machineCPU()
	return m
}

// since returns the CPU spent from m to now, over events events.
func (m cpuMark) since(events int) *cpuUse {
	now := markCPU()
	u := &cpuUse{ProcessS: (now.proc - m.proc).Seconds(), MachineBusy: -1}
	if events > 0 {
		u.PerEventUs = float64((now.proc - m.proc).Microseconds()) / float64(events)
	}
	if m.machine && now.machine && now.total > m.total {
		u.MachineBusy = float64(now.busy-m.busy) / float64(now.total-m.total)
	}
	return u
}

// machineCPU returns the busy and total ticks of all cores from /proc/stat
// (Linux); ok is false elsewhere.
func machineCPU() (busy, total uint64, ok bool) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0, false
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, false
	}
	// user nice system idle iowait irq softirq steal (guest time is in user)
	for i, s := range fields[1:min(len(fields), 9)] {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total, true
}

// cpuRow is the table's line for u.
func cpuRow(u *cpuUse) string {
	if u == nil {
		return ""
	}
	s := strconv.FormatFloat(u.PerEventUs, 'f', 1, 64) + " µs/event"
	if u.MachineBusy >= 0 {
		s += ", cores " + strconv.FormatFloat(100*u.MachineBusy, 'f', 0, 64) + "% busy"
	}
	return s
}

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux platform Go runs on).
const clockTicks = 100

// processCPU returns the CPU time (user and system, every thread) that the
// process pid has used so far, from /proc/<pid>/stat; ok is false where it
// cannot be read.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// the command name, field 2, is in parentheses and may hold spaces:
	// the fields after its closing one start at field 3 (state)
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseUint(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * time.Second / clockTicks, true
}

// allocUse is what the Go heap allocated over a run, an event each.
type allocUse struct {
	ObjectsPerEvent float64 `json:"allocs_per_event"`
	BytesPerEvent   float64 `json:"alloc_bytes_per_event"`
}

// allocMark is where a run's allocation count starts.
type allocMark struct{ objects, bytes uint64 }

var allocSamples = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}

// markAllocs reads the heap allocations of this process so far
// (runtime/metrics: cumulative, every goroutine).
func markAllocs() allocMark {
	s := slices.Clone(allocSamples)
	metrics.Read(s)
	var m allocMark
	if s[0].Value.Kind() == metrics.KindUint64 {
		m.objects = s[0].Value.Uint64()
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		m.bytes = s[1].Value.Uint64()
	}
	return m
}

// since returns the allocations from m to now over events events.
func (m allocMark) since(events int) *allocUse {
	if events <= 0 {
		return nil
	}
	now := markAllocs()
	return &allocUse{ObjectsPerEvent: float64(now.objects-m.objects) / float64(events),
		BytesPerEvent: float64(now.bytes-m.bytes) / float64(events)}
}
