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
}

// Devices is the number of GPUs the row measured, one when unrecorded.
func (r BenchRow) Devices() int { return max(r.GPUs, 1) }

// Row is the table's row for one trainer.Bench measurement of config c at
// batch x seq; name is the model preset's name, or empty for a shape that
// is not one.
func Row(name string, c model.Config, batch, seq int, r trainer.BenchResult) BenchRow {
	return BenchRow{Model: name, Vocab: c.VocabSize, DModel: c.Hidden, Layers: c.Layers, Batch: batch, Seq: seq,
		TokPerSec: r.TokPerSec, PeakMemory: r.PeakAllocated, MFU: r.MFU, GPUIdle: r.GPUIdle(), Device: r.Device, GPUs: r.GPUs}
}

// Same reports whether r measured the given shape on gpus GPUs (0: any
// number, for a run on all of a host's GPUs, counted only as it trains).
func (r BenchRow) Same(vocab, dModel, layers, batch, seq, gpus int) bool {
	return r.Vocab == vocab && r.DModel == dModel && r.Layers == layers && r.Batch == batch && r.Seq == seq &&
		(gpus == 0 || r.Devices() == gpus)
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
			if rows[i].Same(row.Vocab, row.DModel, row.Layers, row.Batch, row.Seq, row.Devices()) {
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

// FindBench returns the tok/s measured for a shape on gpus GPUs (0: any),
// or 0.
func FindBench(rows []BenchRow, vocab, dModel, layers, batch, seq, gpus int) float64 {
	for _, r := range rows {
		if r.Same(vocab, dModel, layers, batch, seq, gpus) && r.Error == "" {
			return r.TokPerSec
		}
	}
	return 0
}

// BenchTable renders the sweep as a Markdown table.
func BenchTable(rows []BenchRow) string {
	var b strings.Builder
	var out [][]string
	for _, r := range rows {
		name := r.Model
		if name == "" {
			name = "-"
		}
		tps, mem, mfu, idle := "-", "-", "-", "no"
		if r.Error != "" {
			tps = "error: " + r.Error
		} else {
			tps = fmt.Sprintf("%.0f", r.TokPerSec)
			mem = fmt.Sprintf("%.2f GiB", float64(r.PeakMemory)/(1<<30))
			if r.MFU > 0 {
				mfu = fmt.Sprintf("%.1f%%", r.MFU*100)
			}
		}
		if r.GPUIdle {
			idle = "yes"
		}
		out = append(out, []string{name, fmt.Sprint(r.Vocab), fmt.Sprint(r.DModel), fmt.Sprint(r.Layers),
			fmt.Sprint(r.Batch), fmt.Sprint(r.Seq), fmt.Sprint(r.Devices()), tps, mem, mfu, idle})
	}
	table(&b, []string{"model", "vocab", "d_model", "layers", "batch", "seq", "GPUs", "tok/s", "peak memory", "MFU", "GPU idle"}, out)
	return b.String()
}
