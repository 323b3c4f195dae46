//go:build unix

package tokenizer

import (
	"syscall"
	"testing"
	"time"
)

// reportCPUPerGB reports the process's CPU time (user and system, every
// thread: the collector's and the kernel's page faults included) per GB of
// text over the benchmark's loop, from start (a processCPU reading taken
// before it). Wall time alone cannot say whether more cores did more work
// per byte or only waited.
func reportCPUPerGB(b *testing.B, start time.Duration, bytesPerOp int64) {
	if b.N == 0 || bytesPerOp == 0 {
		return
	}
	used := processCPU() - start
	b.ReportMetric(used.Seconds()/float64(bytesPerOp*int64(b.N))*1e9, "cpu-s/GB")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
