package results

import (
	"math"
	"strings"
	"testing"
)

func TestReadBenchReplacesSameShape(t *testing.T) {
	in := `{"vocab":16384,"d_model":512,"layers":8,"batch":16,"seq":512,"tok_per_sec":40000,"peak_memory_bytes":2147483648,"mfu":0.31,"gpu_idle":false}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":32,"seq":1024,"tok_per_sec":90000,"peak_memory_bytes":8589934592,"mfu":0.35,"gpu_idle":true,"device":"NVIDIA H200"}
{"vocab":16384,"d_model":512,"layers":8,"batch":16,"seq":512,"tok_per_sec":43704,"peak_memory_bytes":2147483648,"mfu":0.33,"gpu_idle":true,"device":"NVIDIA H200"}
{"vocab":16384,"d_model":768,"layers":12,"batch":16,"seq":512,"error":"out of memory"}
{"vocab":16384,"d_model":512,"layers":8,"batch":16,"seq":512,"tok_per_sec":85000,"gpu_idle":true,"gpus":2,"device":"NVIDIA H200"}
{"vocab":16384,"d_model":512,"layers":8,"batch":16,"seq":512,"tok_per_sec":30000,"gpu_idle":true,"moe":"experts=8,top_k=2,d_ff=352"}
`
	rows, err := ReadBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	// The same shape on two GPUs is a row of its own: a run on two GPUs
	// is held to it, a run on one to the one-GPU row.
	if len(rows) != 5 {
		t.Fatalf("got %d rows, want 5", len(rows))
	}
	// With experts it is another model: the dense row is not its figure.
	if row := FindBench(rows, BenchRow{Vocab: 16384, DModel: 512, Layers: 8, Batch: 16, Seq: 512, GPUs: 1, MoE: "experts=8,top_k=2,d_ff=352"}); row.TokPerSec != 30000 {
		t.Errorf("the shape with experts: %v, want 30000", row.TokPerSec)
	}
	if row := FindBench(rows, BenchRow{Vocab: 16384, DModel: 512, Layers: 8, Batch: 16, Seq: 512, GPUs: 1}); row.TokPerSec != 43704 {
		t.Errorf("re-measured shape: %v, want the later 43704", row.TokPerSec)
	}
	if row := FindBench(rows, BenchRow{Vocab: 16384, DModel: 512, Layers: 8, Batch: 16, Seq: 512, GPUs: 2}); row.TokPerSec != 85000 {
		t.Errorf("the shape on 2 GPUs: %v, want 85000", row.TokPerSec)
	}
	if row := FindBench(rows, BenchRow{Vocab: 16384, DModel: 512, Layers: 8, Batch: 16, Seq: 512, GPUs: 4}); row.TokPerSec != 0 {
		t.Errorf("the shape on 4 GPUs was never measured, got %v", row.TokPerSec)
	}
	if row := FindBench(rows, BenchRow{Vocab: 16384, DModel: 768, Layers: 12, Batch: 16, Seq: 512, GPUs: 1}); row.TokPerSec != 0 {
		t.Errorf("failed shape must have no figure, got %v", row.TokPerSec)
	}
	tab := BenchTable(rows)
	for _, want := range []string{"| model ", "| GPU idle |", "| GPUs |", "| experts ", "experts=8,top_k=2,d_ff=352", "| 2 ", "43704", "8.00 GiB", "35.0%", "| small ", "error: out of memory", "| yes "} {
		if !strings.Contains(tab, want) {
			t.Errorf("bench table lacks %q:\n%s", want, tab)
		}
	}
}

// A row the CPU engine measured says nothing of GPUs: no count, no rate
// per GPU, no "GPU idle" (a CPU figure taken beside busy processes has
// its own column).
func TestBenchTableCPURowNamesNoGPU(t *testing.T) {
	in := `{"model":"tiny","vocab":4096,"d_model":64,"layers":2,"batch":8,"seq":32,"tok_per_sec":13000,"precision":"fp32","gpu_idle":true,"gpus":1}
{"model":"tiny","vocab":4096,"d_model":64,"layers":2,"batch":16,"seq":32,"tok_per_sec":900000,"precision":"bf16","gpu_idle":true,"gpus":1,"device":"NVIDIA H200"}
`
	rows, err := ReadBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(BenchTable(rows), "\n")
	var cpu, gpu []string
	for _, l := range lines {
		cells := strings.Split(l, "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case strings.Contains(l, "| 13000 "):
			cpu = cells
		case strings.Contains(l, "| 900000 "):
			gpu = cells
		}
	}
	if cpu == nil || gpu == nil {
		t.Fatalf("rows missing from the table:\n%s", strings.Join(lines, "\n"))
	}
	head := strings.Split(lines[0], "|")
	col := func(name string) int {
		for i, h := range head {
			if strings.TrimSpace(h) == name {
				return i
			}
		}
		t.Fatalf("no column %q in %q", name, lines[0])
		return 0
	}
	for _, c := range []struct{ col, cpu, gpu string }{{"GPUs", "-", "1"}, {"tok/s per GPU", "-", "900000"}, {"GPU idle", "-", "yes"}} {
		i := col(c.col)
		if cpu[i] != c.cpu || gpu[i] != c.gpu {
			t.Errorf("column %s: CPU row %q, GPU row %q; want %q and %q", c.col, cpu[i], gpu[i], c.cpu, c.gpu)
		}
	}
}

// A run's gate compares it with the bench of its own step: the same
// micro-batches a step (the optimizer's share shrinks with them) and the
// same precision, where the row records one.
func TestFindBenchMatchesTheRunsStep(t *testing.T) {
	in := `{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":1400000}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":1500000,"accumulate":16,"precision":"bf16"}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":400000,"accumulate":16,"precision":"fp32"}
{"model":"tiny","vocab":4096,"d_model":64,"layers":2,"batch":2,"seq":32,"tok_per_sec":6600,"precision":"bf16","other_cpu":0.31}
{"model":"tiny","vocab":4096,"d_model":64,"layers":2,"batch":8,"seq":32,"tok_per_sec":13000,"precision":"fp32"}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":2900000,"gpus":2,"accumulate":16,"precision":"bf16"}
`
	rows, err := ReadBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 6 {
		t.Fatalf("got %d rows, want 6: each differs in its step", len(rows))
	}
	small := BenchRow{Vocab: 16384, DModel: 512, Layers: 8}
	tiny := BenchRow{Vocab: 4096, DModel: 64, Layers: 2}
	for _, c := range []struct {
		name                  string
		c                     BenchRow
		batch, seq, acc, gpus int
		precision             string
		want                  float64
	}{
		{"the pilot's step", small, 8, 1024, 16, 1, "bf16", 1500000},
		{"the pilot's step in fp32", small, 8, 1024, 16, 1, "fp32", 400000},
		// A row written before precision was recorded stands for either.
		{"one micro-batch a step", small, 8, 1024, 1, 1, "fp32", 1400000},
		{"the pilot's step on two GPUs", small, 8, 1024, 16, 2, "bf16", 2900000},
		{"on all GPUs: any count", small, 8, 1024, 16, 0, "bf16", 1500000},
		// pilot-cpu's step: batch 2, accumulate 4, fp32. Neither the row of
		// one micro-batch of 2 nor one micro-batch of 8 (= 2 x 4) is it.
		{"pilot-cpu's step", tiny, 2, 32, 4, 1, "fp32", 0},
		{"a bf16 row for an fp32 step", tiny, 2, 32, 1, 1, "fp32", 0},
		{"the same step in bf16", tiny, 2, 32, 1, 1, "bf16", 6600},
	} {
		key := c.c
		key.Batch, key.Seq, key.Accumulate, key.GPUs, key.Precision = c.batch, c.seq, c.acc, c.gpus, c.precision
		if row := FindBench(rows, key); row.TokPerSec != c.want {
			t.Errorf("%s: %v, want %v", c.name, row.TokPerSec, c.want)
		}
	}
	tab := BenchTable(rows)
	for _, want := range []string{"| accumulate | precision |", "| 16         | bf16      |", "| 1          | -         |", "| others' CPU |", "| 31%         |"} {
		if !strings.Contains(tab, want) {
			t.Errorf("bench table lacks %q:\n%s", want, tab)
		}
	}
}

func TestReadBenchNamesBadLine(t *testing.T) {
	if _, err := ReadBench(strings.NewReader("{}\n{oops\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("want an error naming line 2, got %v", err)
	}
}

// A sweep on a worker of several GPUs measures each shape on all of them
// and on one: the table gives the rate per GPU and the scaling against
// the one-GPU row of the same shape and kind of GPU, at the same global
// batch.
func TestBenchTableShowsTheScalingOfSeveralGPUs(t *testing.T) {
	in := `{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":32,"seq":1024,"tok_per_sec":3420000,"precision":"bf16","gpus":2,"device":"NVIDIA H200","gpu_idle":true}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":32,"seq":1024,"tok_per_sec":1800000,"precision":"bf16","gpus":1,"device":"NVIDIA H200","gpu_idle":true}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":3100000,"accumulate":16,"precision":"bf16","gpus":2,"device":"NVIDIA H200","gpu_idle":true}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":1600000,"precision":"bf16","gpus":1,"device":"NVIDIA H200","gpu_idle":true}
{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":8,"seq":1024,"tok_per_sec":1550000,"accumulate":16,"precision":"bf16","gpus":1,"device":"NVIDIA RTX 3060","gpu_idle":true}
{"model":"base","vocab":16384,"d_model":768,"layers":12,"batch":16,"seq":1024,"tok_per_sec":1000000,"precision":"bf16","gpus":2,"device":"NVIDIA H200","gpu_idle":true}
{"model":"base","vocab":16384,"d_model":768,"layers":12,"batch":16,"seq":1024,"precision":"bf16","gpus":1,"device":"NVIDIA H200","error":"out of memory"}
`
	rows, err := ReadBench(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 7 {
		t.Fatalf("got %d rows, want 7", len(rows))
	}
	one := OneGPU(rows, rows[0])
	if one.TokPerSec != 1800000 {
		t.Fatalf("small 32 on 2 GPUs is counted against %v, want the one-GPU row's 1800000", one.TokPerSec)
	}
	if sc := rows[0].Scaling(one); math.Abs(sc-0.95) > 1e-12 {
		t.Errorf("scaling %v, want 3420000 / (2 x 1800000) = 0.95", sc)
	}
	// The pilot's step on 2 GPUs: no row of one H200 at 16 micro-batches
	// (one of another step, one of another GPU), and base's one-GPU row
	// failed. Neither has a scaling.
	for _, r := range []BenchRow{rows[2], rows[5]} {
		if o := OneGPU(rows, r); o.TokPerSec != 0 {
			t.Errorf("%s %dx%d on 2 GPUs counted against %+v", r.Model, r.Batch, r.Seq, o)
		}
	}
	tab := BenchTable(rows)
	lines := strings.Split(strings.TrimSpace(tab), "\n")
	cells := func(line string) []string {
		cs := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cs {
			cs[i] = strings.TrimSpace(cs[i])
		}
		return cs
	}
	head := cells(lines[0])
	col := func(name string) int {
		for i, h := range head {
			if h == name {
				return i
			}
		}
		t.Fatalf("the table has no column %q: %v", name, head)
		return -1
	}
	total, perGPU, scaling := col("tok/s"), col("tok/s per GPU"), col("scaling")
	for i, want := range [][3]string{
		{"3420000", "1710000", "95.0% (1.90x one GPU)"},
		{"1800000", "1800000", "-"},
		{"3100000", "1550000", "-"},
		{"1600000", "1600000", "-"},
		{"1550000", "1550000", "-"},
		{"1000000", "500000", "-"},
		{"error: out of memory", "-", "-"},
	} {
		row := cells(lines[2+i])
		if got := [3]string{row[total], row[perGPU], row[scaling]}; got != want {
			t.Errorf("row %d: tok/s, per GPU, scaling %q, want %q", i+1, got, want)
		}
	}
}
