package trainer

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	stat := "cpu  4705 150 1120 16250 520 20 30 5 40 0\ncpu0 2352 75 560 8125 260 10 15 2 20 0\nintr 1\n"
	busy, total, err := parseProcStat([]byte(stat))
	// busy: user, nice, system, irq, softirq, steal; total adds idle and
	// iowait; guest times are inside user already.
	if err != nil || busy != 4705+150+1120+20+30+5 || total != busy+16250+520 {
		t.Fatalf("busy %d, total %d, %v", busy, total, err)
	}
	for _, bad := range []string{"", "intr 1\n", "cpu 1 2 3\n", "cpu 1 2 3 x 5 6 7\n"} {
		if _, _, err := parseProcStat([]byte(bad)); err == nil || !strings.Contains(err.Error(), "/proc/stat") {
			t.Errorf("%q: %v; want an error naming /proc/stat", bad, err)
		}
	}
}

func TestOthersShare(t *testing.T) {
	a := cpuSample{busy: 100, total: 400, own: 10, ok: true}
	// 200 CPU seconds passed on the machine, 120 of them busy, 40 of those
	// this process's: others used 80 of 200.
	b := cpuSample{busy: 220, total: 600, own: 50, ok: true}
	if s, ok := othersShare(a, b); !ok || s != 0.4 {
		t.Fatalf("share %v, %v; want 0.4", s, ok)
	}
	if _, ok := othersShare(a, cpuSample{}); ok {
		t.Fatal("a sample that could not be taken gave a share")
	}
	// Ticks are coarser than the process's own times: never below 0.
	if s, _ := othersShare(a, cpuSample{busy: 110, total: 500, own: 25, ok: true}); s != 0 {
		t.Fatalf("share %v; want 0", s)
	}
}

// A CPU bench taken while other processes keep every core busy records
// that they did: the gate then does not trust its figure.
func TestBenchRecordsOtherProcessesCPU(t *testing.T) {
	if _, err := os.Stat("/proc/stat"); err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	n := runtime.NumCPU()
	ctx, cancel := context.WithCancel(context.Background())
	var spinners []*exec.Cmd
	defer func() {
		cancel() // kills them
		for _, c := range spinners {
			c.Wait()
		}
	}()
	for range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestHelperSpin$")
		cmd.Env = append(os.Environ(), "KILN_TEST_SPIN=1")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		spinners = append(spinners, cmd)
		// Each spinner says so once its loop runs.
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "spinning\n" {
			t.Fatalf("spinner: %q, %v", line, err)
		}
	}
	r, err := Bench(ctx, BenchOptions{Model: benchConfig(), Engine: "cpu", Batch: 2, Seq: 16, Steps: 100, Warmup: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.OtherCPU < 0.25 {
		t.Fatalf("other processes' share %.2f beside %d spinning processes on %d cores; want at least 0.25", r.OtherCPU, n, n)
	}
}

// TestHelperSpin is the busy process of TestBenchRecordsOtherProcessesCPU.
func TestHelperSpin(t *testing.T) {
	if os.Getenv("KILN_TEST_SPIN") != "1" {
		t.Skip("a helper process of TestBenchRecordsOtherProcessesCPU")
	}
	os.Stdout.WriteString("spinning\n")
	for x := 0; ; x++ {
		if x < 0 {
			return
		}
	}
}
