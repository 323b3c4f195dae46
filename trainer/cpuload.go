package trainer

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

// cpuSample is the machine's CPU time and this process's own at one moment,
// so that two of them say how much of the machine other processes used in
// between: a CPU engine's bench beside them measures them too.
type cpuSample struct {
	// busy and total are the machine's CPU seconds, all cores together,
	// from /proc/stat.
	busy, total float64
	// own is this process's user and system CPU seconds.
	own float64
	ok  bool
}

// userHZ is the unit of /proc/stat's times: 100 a second on every Linux
// architecture Go builds for (USER_HZ, fixed by the kernel's ABI).
const userHZ = 100

func sampleCPU() cpuSample {
	var s cpuSample
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return s
	}
	s.own = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	busy, total, err := parseProcStat(b)
	if err != nil {
		return s
	}
	s.busy, s.total, s.ok = float64(busy)/userHZ, float64(total)/userHZ, true
	return s
}

// parseProcStat reads /proc/stat's first line (all cores: user, nice,
// system, idle, iowait, irq, softirq, steal, then guest times) into busy
// and total ticks.
func parseProcStat(b []byte) (busy, total uint64, err error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 8 || string(f[0]) != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: first line %q is not the cores' total", line)
	}
	for i, v := range f[1:] {
		if i >= 8 { // guest times are counted in user and nice already
			break
		}
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %q is not a tick count", v)
		}
		total += n
		if i != 3 && i != 4 { // idle and iowait
			busy += n
		}
	}
	return busy, total, nil
}

// othersShare is the share of the machine's CPU time from a to b that
// other processes used (0 to 1), and whether both samples were taken.
func othersShare(a, b cpuSample) (float64, bool) {
	if !a.ok || !b.ok || b.total <= a.total {
		return 0, false
	}
	others := (b.busy - a.busy) - (b.own - a.own)
	return min(max(others/(b.total-a.total), 0), 1), true
}
