package results

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
)

// BenchRow is one shape of the bench sweep as `sched bench` measured it.
type BenchRow struct {
	Model     string  `json:"model,omitempty"` // preset name, when the shape is one
	Vocab     int     `json:"vocab"`
	DModel    int     `json:"d_model"`
	Layers    int     `json:"layers"`
	Batch     int     `json:"batch"`
	Seq       int     `json:"seq"`
	TokPerSec float64 `json:"tok_per_sec"`
	// Accumulate is the micro-batches of a step, over all GPUs, as a run's
	// accumulate (0 in rows written before it was recorded: one a GPU).
	Accumulate int `json:"accumulate,omitempty"`
	// Precision is the engine's (bf16 or fp32; empty in rows written
	// before it was recorded).
	Precision string `json:"precision,omitempty"`
	// OtherCPU is the share of the machine's CPU that other processes used
	// while it was measured (0 to 1): on the CPU engine, a figure they
	// held back.
	OtherCPU float64 `json:"other_cpu,omitempty"`
	// PeakMemory is the engine's peak allocation in bytes.
	PeakMemory int64   `json:"peak_memory_bytes"`
	MFU        float64 `json:"mfu"`
	// GPUIdle records whether no other process used the device during the
	// measurement; the seed plan's contended figures were 2.1x too low.
	GPUIdle bool   `json:"gpu_idle"`
	Device  string `json:"device,omitempty"`
	Error   string `json:"error,omitempty"`
	// GPUs is how many GPUs trained together (0 in rows written before
	// there were several: one); TokPerSec is all of theirs.
	GPUs int `json:"gpus,omitempty"`
	// MoE is a mixture of experts' shape, as MoEShape writes it; empty for
	// a dense model.
	MoE string `json:"moe,omitempty"`
}

// MoEShape names what a model's experts cost in speed: their number,
// how many a token takes and their width (the load-balancing
// coefficient costs nothing). Empty for a dense model.
func MoEShape(c model.Config) string {
	if !c.MoE() {
		return ""
	}
	return fmt.Sprintf("experts=%d,top_k=%d,d_ff=%d", c.Experts, c.ExpertsPerTok, c.Intermediate)
}

// Devices is the number of GPUs the row measured, one when unrecorded.
func (r BenchRow) Devices() int { return max(r.GPUs, 1) }

// MicroBatches is the micro-batches of a step over all GPUs, one a GPU
// when unrecorded.
func (r BenchRow) MicroBatches() int {
	if r.Accumulate > 0 {
		return r.Accumulate
	}
	return r.Devices()
}

// Row is the table's row for one trainer.Bench measurement of config c at
// batch x seq; name is the model preset's name, or empty for a shape that
// is not one.
func Row(name string, c model.Config, batch, seq int, r trainer.BenchResult) BenchRow {
	return BenchRow{Model: name, Vocab: c.VocabSize, DModel: c.Hidden, Layers: c.Layers, Batch: batch, Seq: seq,
		TokPerSec: r.TokPerSec, PeakMemory: r.PeakAllocated, MFU: r.MFU, GPUIdle: r.GPUIdle(), Device: r.Device, GPUs: r.GPUs,
		MoE: MoEShape(c), Accumulate: r.Accumulate, Precision: r.Precision, OtherCPU: r.OtherCPU}
}

// Same reports whether r measured o's step: the model (with its
// experts), the batch, the sequence and the micro-batches a step, on as
// many GPUs (0 in o: any number, for a run on all of a host's GPUs,
// counted only as it trains), in the same precision where both record
// one.
func (r BenchRow) Same(o BenchRow) bool {
	return r.Vocab == o.Vocab && r.DModel == o.DModel && r.Layers == o.Layers && r.Batch == o.Batch && r.Seq == o.Seq &&
		r.MoE == o.MoE && (o.GPUs == 0 || r.Devices() == o.Devices()) && r.MicroBatches() == o.MicroBatches() &&
		(r.Precision == "" || o.Precision == "" || r.Precision == o.Precision)
}

// Shape is the row key of model c's step at batch x seq, accumulate
// micro-batches a step over gpus GPUs, in precision (empty: any), for Same
// and FindBench.
func Shape(c model.Config, batch, seq, accumulate, gpus int, precision string) BenchRow {
	return BenchRow{Vocab: c.VocabSize, DModel: c.Hidden, Layers: c.Layers, Batch: batch, Seq: seq, Accumulate: accumulate, GPUs: gpus,
		MoE: MoEShape(c), Precision: precision}
}

// ReadBench reads bench rows stored one JSON object per line
// (results/bench/sweep.jsonl). A later row for the same shape replaces an
// earlier one, so that re-running the sweep updates the table in place.
func ReadBench(r io.Reader) ([]BenchRow, error) {
	var rows []BenchRow
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		t := bytes.TrimSpace(sc.Bytes())
		if len(t) == 0 {
			continue
		}
		var row BenchRow
		if err := json.Unmarshal(t, &row); err != nil {
			return nil, fmt.Errorf("bench line %d is not a JSON row (%v): fix or delete that line", line, err)
		}
		replaced := false
		for i := range rows {
			key := row
			key.GPUs = row.Devices()
			if rows[i].Same(key) {
				rows[i], replaced = row, true
			}
		}
		if !replaced {
			rows = append(rows, row)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read bench rows: %w", err)
	}
	return rows, nil
}

// FindBench returns the row measured for shape (a Shape key), or the zero
// row.
func FindBench(rows []BenchRow, shape BenchRow) BenchRow {
	for _, r := range rows {
		if r.Same(shape) && r.Error == "" {
			return r
		}
	}
	return BenchRow{}
}

// CPUBusy reports whether r is a CPU engine's figure (no device) taken
// while other processes used at least BusyCPU of the machine.
func (r BenchRow) CPUBusy() bool { return r.Device == "" && r.OtherCPU >= BusyCPU }

// OneGPU returns the row of r's shape measured on one GPU of the same
// kind, with the same micro-batches a step (so the same global batch), or
// the zero row: the figure r's scaling is counted against.
func OneGPU(rows []BenchRow, r BenchRow) BenchRow {
	for _, o := range rows {
		if o.Devices() == 1 && o.Error == "" && o.Device == r.Device && o.Vocab == r.Vocab && o.DModel == r.DModel && o.Layers == r.Layers &&
			o.Batch == r.Batch && o.Seq == r.Seq && o.MoE == r.MoE && o.Accumulate == r.Accumulate && o.Precision == r.Precision {
			return o
		}
	}
	return BenchRow{}
}

// Scaling is r's tokens per second over what its GPUs would train at one
// GPU's rate (one's): 1 is linear. 0 where either is unknown.
func (r BenchRow) Scaling(one BenchRow) float64 {
	if r.Error != "" || r.TokPerSec <= 0 || one.TokPerSec <= 0 {
		return 0
	}
	return r.TokPerSec / (float64(r.Devices()) * one.TokPerSec)
}

// BenchTable renders the sweep as a Markdown table. A row of several GPUs
// shows its rate per GPU and its scaling against the row of one GPU of the
// same shape, where the sweep measured one (it does on a worker of several
// GPUs).
func BenchTable(rows []BenchRow) string {
	var b strings.Builder
	var out [][]string
	for _, r := range rows {
		name := r.Model
		if name == "" {
			name = "-"
		}
		tps, perGPU, scaling, mem, mfu, idle := "-", "-", "-", "-", "-", "no"
		if r.Error != "" {
			tps = "error: " + r.Error
		} else {
			tps = fmt.Sprintf("%.0f", r.TokPerSec)
			perGPU = fmt.Sprintf("%.0f", r.TokPerSec/float64(r.Devices()))
			if r.Devices() > 1 {
				if one := OneGPU(rows, r); one.TokPerSec > 0 {
					sc := r.Scaling(one)
					scaling = fmt.Sprintf("%.1f%% (%.2fx one GPU)", sc*100, sc*float64(r.Devices()))
				}
			}
			mem = fmt.Sprintf("%.2f GiB", float64(r.PeakMemory)/(1<<30))
			if r.MFU > 0 {
				mfu = fmt.Sprintf("%.1f%%", r.MFU*100)
			}
		}
		gpus := fmt.Sprint(r.Devices())
		switch {
		case r.Device == "" && r.Error == "":
			// The CPU engine's row: no GPU was measured, idle or not.
			gpus, perGPU, idle = "-", "-", "-"
		case r.GPUIdle:
			idle = "yes"
		}
		experts := "-"
		if r.MoE != "" {
			experts = r.MoE
		}
		precision := r.Precision
		if precision == "" {
			precision = "-"
		}
		others := "-"
		if r.OtherCPU > 0 {
			others = fmt.Sprintf("%.0f%%", r.OtherCPU*100)
		}
		out = append(out, []string{name, fmt.Sprint(r.Vocab), fmt.Sprint(r.DModel), fmt.Sprint(r.Layers), experts,
			fmt.Sprint(r.Batch), fmt.Sprint(r.Seq), fmt.Sprint(r.MicroBatches()), precision, gpus, tps, perGPU, scaling, mem, mfu, idle, others})
	}
	table(&b, []string{"model", "vocab", "d_model", "layers", "experts", "batch", "seq", "accumulate", "precision", "GPUs", "tok/s", "tok/s per GPU", "scaling", "peak memory", "MFU", "GPU idle", "others' CPU"}, out)
	return b.String()
}
