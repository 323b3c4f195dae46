package trainer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-lm/kiln/model"
)

// Metrics is one line of metrics.jsonl: the one type that writes and reads
// it (results.Record is this type). A training line carries Loss; an
// evaluation line (a fresh run's step 0) carries EvalLoss alone; a step
// that evaluated carries both. Absent values are nil or zero and omitted.
type Metrics struct {
	Step   int   `json:"step"`
	Tokens int64 `json:"tokens"`
	// Loss is the step's training loss (a mixture of experts' includes
	// its load-balancing term), PPL its exponential.
	Loss *float64 `json:"loss,omitempty"`
	PPL  *float64 `json:"ppl,omitempty"`
	// AuxLoss is a mixture of experts' load-balancing loss (before its
	// coefficient); absent for a dense model.
	AuxLoss *float64 `json:"aux_loss,omitempty"`
	// ExpertShare is a mixture of experts' share of the step's (token,
	// choice) pairs per expert, over every layer (it sums to 1): an expert
	// near 0 is starving.
	ExpertShare []float64 `json:"expert_share,omitempty"`
	LR          float64   `json:"lr,omitempty"`
	GradNorm    float64   `json:"grad_norm,omitempty"`
	// TokPerSec is every GPU's together; GPUs says how many trained, where
	// more than one.
	TokPerSec float64 `json:"tok_per_s,omitempty"`
	GPUs      int     `json:"gpus,omitempty"`
	// MFU is the model FLOP utilisation of each device, absent where the
	// device's peak is unknown (the CPU).
	MFU *float64 `json:"mfu,omitempty"`
	// EvalLoss is set on steps that ran an evaluation.
	EvalLoss *float64 `json:"eval_loss,omitempty"`
	EvalPPL  *float64 `json:"eval_ppl,omitempty"`
	// EvalLossByStore is each store's own held-out loss, by store name, on
	// steps that evaluated a run of several stores.
	EvalLossByStore map[string]float64 `json:"eval_loss_by_store,omitempty"`
	// EvalLeftOut names the stores of such a run that the evaluation
	// left out, holding no held-out window: its eval losses are the
	// other stores' alone.
	EvalLeftOut []string `json:"eval_left_out,omitempty"`
	// PeakMemory is the engine's peak allocation so far, in bytes.
	PeakMemory int64 `json:"peak_memory_bytes,omitempty"`
	// ElapsedS is the wall time since this process began the run's loop,
	// in seconds; a resumed segment starts again from 0.
	ElapsedS float64 `json:"elapsed_s,omitempty"`
}

// LossOr is the training loss, or or when the line has none.
func (m Metrics) LossOr(or float64) float64 {
	if m.Loss == nil {
		return or
	}
	return *m.Loss
}

// WriteJSONL writes m as one line.
func (m Metrics) WriteJSONL(w io.Writer) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// FLOPsPerToken is the training cost of one token: 6N for the parameter
// matmuls (forward and backward) plus 12 L T d for attention scores and
// values, the PaLM appendix B estimate. N counts the embedding table too
// because the tied LM head multiplies by it, and only the active
// parameters of a mixture of experts, the ones a token's pass multiplies.
func FLOPsPerToken(c model.Config, seq int) float64 {
	return 6*float64(ActiveParams(c)) + 12*float64(c.Layers)*float64(seq)*float64(c.Hidden)
}

// ActiveParams is the parameters one token's pass uses: with experts,
// every layer's router and the top_k experts its router picks, not the
// others (a dense model uses them all).
func ActiveParams(c model.Config) int {
	n := c.NumParams()
	if c.MoE() {
		n -= c.Layers * (c.Experts - c.ExpertsPerTok) * 3 * c.Intermediate * c.Hidden
	}
	return n
}

// PeakFLOPS is the dense (no sparsity) peak of known GPUs, in FLOP/s,
// for bf16 tensor-core math and plain fp32, from the vendors' data sheets.
// Names match nvidia-smi's product names by substring.
var PeakFLOPS = []struct {
	Name       string
	BF16, FP32 float64
}{
	{"H200", 989e12, 67e12},
	{"H100 PCIe", 756e12, 51e12},
	{"H100", 989e12, 67e12},
	{"A100", 312e12, 19.5e12},
	{"L40S", 362e12, 91.6e12},
	{"L4", 121e12, 30.3e12},
	{"A10", 125e12, 31.2e12},
	{"RTX 4090", 165e12, 82.6e12},
	{"RTX 3090", 71e12, 35.6e12},
	{"RTX 3080", 59.5e12, 29.8e12},
	{"RTX 3060", 25.6e12, 12.7e12},
}

// PeakFor returns the peak FLOP/s of the named device at precision, or 0
// when it is not in the table (then MFU is left out).
func PeakFor(device, precision string) float64 {
	for _, p := range PeakFLOPS {
		if strings.Contains(device, p.Name) {
			if precision == "fp32" {
				return p.FP32
			}
			return p.BF16
		}
	}
	return 0
}

// MFU is tok/s x FLOPs per token / peak, or nil without a known peak.
func MFU(tokPerS, flopsPerToken, peak float64) *float64 {
	if peak <= 0 || math.IsNaN(tokPerS) {
		return nil
	}
	v := tokPerS * flopsPerToken / peak
	return &v
}

// truncateMetrics keeps the lines of a metrics.jsonl file up to and
// including step, so step 0 keeps the initial evaluation's step-0 line that
// a segment writes before the first step; a missing file is left missing.
// The file is rewritten through a rename, the new version synced before it
// and the directory after (as WriteCheckpoint does), so that a crash or a
// power cut keeps either version whole, never an empty or partial one.
// logged is the step of the last line kept that carries a training loss
// (0: none).
func truncateMetrics(path string, step int) (logged int, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	var kept []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		var m struct {
			Step *int            `json:"step"`
			Loss json.RawMessage `json:"loss"`
		}
		// A torn last line (no newline) is dropped with the steps past the
		// checkpoint: it was being written when the run stopped.
		if !bytes.HasSuffix(line, []byte("\n")) || json.Unmarshal(line, &m) != nil || m.Step == nil || *m.Step > step {
			continue
		}
		kept = append(kept, line...)
		if m.Loss != nil {
			logged = max(logged, *m.Step)
		}
	}
	if len(kept) == len(b) {
		return logged, nil
	}
	tmp := path + ".tmp"
	if _, err := writeSynced(tmp, func(w io.Writer) error { _, err := w.Write(kept); return err }); err != nil {
		return 0, fmt.Errorf("rewrite %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("rewrite %s: %w", path, err)
	}
	if err := SyncDir(filepath.Dir(path)); err != nil {
		return 0, fmt.Errorf("rewrite %s: %w", path, err)
	}
	return logged, nil
}
