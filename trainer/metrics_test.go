package trainer

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

func TestFLOPsPerTokenOfSmall(t *testing.T) {
	c, _ := model.Preset("small")
	// 6 x 32.0M + 12 x 8 layers x 1024 x 512 = 192.1e6 + 50.3e6.
	got := FLOPsPerToken(c, 1024)
	want := 6*float64(c.NumParams()) + 12*8*1024*512
	if got != want || math.Abs(got-242.4e6) > 0.5e6 {
		t.Errorf("FLOPs per token = %g, want %g (about 242.4e6)", got, want)
	}
}

// A mixture of experts costs a token only the experts its router picks:
// the training loop's MFU and the bench's count the same FLOPs.
func TestFLOPsPerTokenCountsActiveExperts(t *testing.T) {
	c, _ := model.Preset("small")
	c.Experts, c.ExpertsPerTok, c.Intermediate = 8, 2, 352
	// Two experts of eight in each layer, and the whole router.
	k := c
	k.Experts = 2
	active := k.NumParams() + c.Layers*6*c.Hidden
	attn := 12 * 8 * 1024 * 512.0
	if got, want := FLOPsPerToken(c, 1024), 6*float64(active)+attn; got != want || got >= 6*float64(c.NumParams())+attn {
		t.Errorf("FLOPs per token = %g, want %g (%d active of %d parameters)", got, want, active, c.NumParams())
	}
}

func TestMFUUsesTheDevicePeak(t *testing.T) {
	peak := PeakFor("NVIDIA H200", "bf16")
	if peak != 989e12 {
		t.Fatalf("H200 bf16 peak = %g", peak)
	}
	if PeakFor("NVIDIA H100 PCIe", "bf16") != 756e12 {
		t.Errorf("H100 PCIe must not match the SXM entry")
	}
	if PeakFor("NVIDIA GeForce RTX 3060", "fp32") != 12.7e12 {
		t.Errorf("RTX 3060 fp32 peak wrong")
	}
	m := MFU(1e6, 242.4e6, peak)
	if m == nil || math.Abs(*m-0.2451) > 1e-3 {
		t.Errorf("MFU = %v, want about 0.245", m)
	}
	if MFU(1e6, 242.4e6, PeakFor("cpu", "fp32")) != nil {
		t.Errorf("unknown device: MFU must be left out")
	}
}

func TestMetricsLineIsOneJSONObject(t *testing.T) {
	var buf bytes.Buffer
	loss, ppl := 2.0, math.Exp(2)
	m := Metrics{Step: 3, Tokens: 300, Loss: &loss, PPL: &ppl, LR: 1e-4, GradNorm: 0.5, TokPerSec: 1000}
	if err := m.WriteJSONL(&buf); err != nil {
		t.Fatal(err)
	}
	line := buf.String()
	if line[len(line)-1] != '\n' || bytes.Count(buf.Bytes(), []byte("\n")) != 1 {
		t.Fatalf("not one line: %q", line)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["step"] != 3.0 || got["loss"] != 2.0 || got["tok_per_s"] != 1000.0 {
		t.Errorf("fields: %v", got)
	}
	if _, ok := got["mfu"]; ok {
		t.Errorf("mfu present without a peak: %v", got)
	}
	// An evaluation-only line (a fresh run's step 0) has no training loss.
	ev := 8.3
	buf.Reset()
	if err := (Metrics{Step: 0, EvalLoss: &ev}).WriteJSONL(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.String() != "{\"step\":0,\"tokens\":0,\"eval_loss\":8.3}\n" {
		t.Errorf("evaluation line %q", buf.String())
	}
}

func TestTruncateMetricsKeepsStepsUpToTheCheckpoint(t *testing.T) {
	path := filepath.Join(t.TempDir(), MetricsFile)
	in := "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n{\"step\":3,\"loss\":2}\n{\"step\":4,\"lo"
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	if logged, err := truncateMetrics(path, 2); err != nil || logged != 2 {
		t.Fatalf("truncated to step 2: last line logged with a loss %d, %v; want 2", logged, err)
	}
	got, _ := os.ReadFile(path)
	if want := "{\"step\":1,\"loss\":3}\n{\"step\":2,\"loss\":2.5}\n"; string(got) != want {
		t.Errorf("kept %q, want %q", got, want)
	}
	// A segment resumed at step 0 keeps the initial evaluation's line.
	if err := os.WriteFile(path, []byte("{\"step\":0,\"loss\":4}\n{\"step\":1,\"loss\":3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := truncateMetrics(path, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "{\"step\":0,\"loss\":4}\n" {
		t.Errorf("truncated to step 0: kept %q, want the step-0 line", got)
	}
	if _, err := truncateMetrics(filepath.Join(t.TempDir(), "absent.jsonl"), 5); err != nil {
		t.Errorf("absent file: %v", err)
	}
}
