package trainer

import (
	"context"
	"strings"
	"testing"
)

// The CPU engine computes in fp32 whatever it is asked, so a bench on it
// asked for bf16 (the default) records fp32: a row saying bf16 would pass
// for a bf16 figure in the table and in a bf16 run's throughput gate.
func TestBenchOnTheCPURecordsFP32(t *testing.T) {
	c := benchConfig()
	for _, asked := range []string{"bf16", "", "fp32"} {
		var notices []string
		r, err := Bench(context.Background(), BenchOptions{Model: c, Engine: "cpu", Precision: asked, Batch: 2, Seq: 16, Steps: 1,
			Log: func(s string) { notices = append(notices, s) }})
		if err != nil {
			t.Fatalf("precision %q: %v", asked, err)
		}
		if r.Engine != "cpu" || r.Precision != "fp32" {
			t.Errorf("precision %q asked: engine %s, precision %s recorded; want cpu, fp32", asked, r.Engine, r.Precision)
		}
		said := strings.Contains(strings.Join(notices, "\n"), "computes in fp32 only")
		if want := asked != "fp32"; said != want {
			t.Errorf("precision %q asked: notices %q; want a notice that the CPU measured fp32: %v", asked, notices, want)
		}
	}
}
