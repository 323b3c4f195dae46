package kernels

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// A bf16 step whose GEMMs run the algorithms tuning picked gives the
// gradients of a step on cuBLASLt's first choices (algorithms may sum K in
// another order, and an intermediate rounded to bf16 may then land on the
// other side: held to 1e-2 of each gradient's largest value, where a wrong
// product errs by its whole size), and tuning timed every product, the
// weight gradients that add into their own output included (timed into
// scratch: were they added to twice, their gradients would be off by their
// whole size).
func TestTunedGemmsMatchLibraryChoice(t *testing.T) {
	skipWithoutGPU(t)
	c, p, b := tuneCase()
	// Each engine times its own: none remembered from an earlier one.
	t.Setenv("KILN_CUDA_GEMM_CHOICES", "off")
	grads := func(tune string) (*model.Params, *Engine) {
		t.Setenv("KILN_CUDA_GEMM_TUNE", tune)
		return microBatchGrads(t, c, p, b, nil)
	}
	want, plain := grads("off")
	got, tuned := grads("")
	if n := len(plain.lt.Tuned()); n != 0 {
		t.Fatalf("KILN_CUDA_GEMM_TUNE=off timed %d products", n)
	}
	products := tuned.lt.Tuned()
	// The q/k/v, output, gate/up and down projections and the head, each
	// forward, input gradient and weight gradient: 15 products (shapes
	// repeat across layers).
	if len(products) < 15 {
		t.Errorf("tuning timed %d products, want 15: %v", len(products), products)
	}
	for name, r := range products {
		if len(r.MS) == 0 {
			t.Errorf("%s: no candidate ran", name)
		}
		t.Logf("%s: %d candidates, first choice %.3f ms, kept #%d %.3f ms", name, len(r.MS), r.MS[0], r.Best, r.MS[r.Best])
	}
	closeGrads(t, c, "tuned GEMMs'", want, got)
}

// A tuned engine's GEMM choices are remembered (KILN_CUDA_GEMM_CHOICES, by
// default the kernel cache) and the next engine takes them instead of
// timing its own: it times nothing and computes the first one's bits,
// which a run resumed in a new process needs to continue the same sums. A
// file that is not a choices file is timed over and replaced.
func TestRememberedGemmChoicesGiveTheSameBits(t *testing.T) {
	skipWithoutGPU(t)
	c, p, b := tuneCase()
	dir := t.TempDir()
	t.Setenv("KILN_CUDA_GEMM_CHOICES", dir)
	first, e1 := microBatchGrads(t, c, p, b, nil)
	if n := len(e1.lt.Tuned()); n < 15 {
		t.Fatalf("the first engine timed %d products, want 15", n)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "gemm-*.json"))
	if len(files) != 1 {
		t.Fatalf("choices files %v, want one", files)
	}
	var kept struct {
		Algorithms map[string][8]uint64 `json:"algorithms"`
	}
	if raw, err := os.ReadFile(files[0]); err != nil || json.Unmarshal(raw, &kept) != nil || len(kept.Algorithms) < 15 {
		t.Fatalf("%s holds %d choices (%v), want 15", files[0], len(kept.Algorithms), err)
	}
	second, e2 := microBatchGrads(t, c, p, b, nil)
	if n := len(e2.lt.Tuned()); n != 0 {
		t.Errorf("the second engine timed %d products, want none: it takes the first one's", n)
	}
	for _, s := range c.Specs() {
		if w, g := first.Tensor(s.Name), second.Tensor(s.Name); !slices.Equal(w, g) {
			t.Errorf("%s: the second engine's gradient is not the first one's bits (%.3g apart)", s.Name, maxRelErr(g, w))
		}
	}
	if err := os.WriteFile(files[0], []byte("not a choices file"), 0o644); err != nil {
		t.Fatal(err)
	}
	var logged []string
	_, e3 := microBatchGrads(t, c, p, b, func(s string) { logged = append(logged, s) })
	if n := len(e3.lt.Tuned()); n < 15 || len(logged) == 0 || !strings.Contains(strings.Join(logged, "\n"), files[0]) {
		t.Errorf("over a broken choices file: %d products timed, logged %q; want 15 timed and a line naming the file", n, logged)
	}
	if raw, err := os.ReadFile(files[0]); err != nil || json.Unmarshal(raw, &kept) != nil || len(kept.Algorithms) < 15 {
		t.Errorf("the broken file was not replaced by the choices: %q", raw)
	}
}

// GEMMs that may use no workspace (KILN_CUDA_GEMM_WORKSPACE=0, which
// leaves out the algorithms that split K through it) give a bf16 step's
// gradients as those that may use all of it do, to the tolerance of
// TestTunedGemmsMatchLibraryChoice.
func TestGemmsWithoutWorkspaceMatch(t *testing.T) {
	skipWithoutGPU(t)
	c, p, b := tuneCase()
	t.Setenv("KILN_CUDA_GEMM_TUNE", "off")
	want, e := microBatchGrads(t, c, p, b, nil)
	if e.wsLimit != wsBytes {
		t.Fatalf("workspace limit %d bytes by default, want %d", e.wsLimit, wsBytes)
	}
	t.Setenv("KILN_CUDA_GEMM_WORKSPACE", "0")
	got, e := microBatchGrads(t, c, p, b, nil)
	if e.wsLimit != 0 {
		t.Fatalf("KILN_CUDA_GEMM_WORKSPACE=0: workspace limit %d bytes, want 0", e.wsLimit)
	}
	closeGrads(t, c, "GEMMs without a workspace:", want, got)
}

// tuneCase is the GEMM tests' model (small, two layers), weights and
// micro-batch (4 x 512).
func tuneCase() (model.Config, *model.Params, model.Batch) {
	c := model.Presets["small"]
	c.Layers = 2
	return c, model.InitParams(c, 3), patternBatch(c, 4, 512)
}

// microBatchGrads is the gradient of one bf16 micro-batch b from p, on an
// engine made with the environment's options (and log, if not nil, for
// what it reports), and the engine.
func microBatchGrads(t *testing.T, c model.Config, p *model.Params, b model.Batch, log func(string)) (*model.Params, *Engine) {
	t.Helper()
	e := newEngine(t, c, model.Options{Precision: "bf16", MaxBatch: b.B, MaxSeq: b.T, Log: log})
	if err := e.SetParams(p); err != nil {
		t.Fatal(err)
	}
	if err := e.ForwardBackward(b, 1); err != nil {
		t.Fatal(err)
	}
	g := model.NewParams(c)
	if err := e.Grads(g); err != nil {
		t.Fatal(err)
	}
	return g, e
}

// closeGrads holds every gradient of got to 1e-2 of want's largest value.
func closeGrads(t *testing.T, c model.Config, what string, want, got *model.Params) {
	t.Helper()
	for _, s := range c.Specs() {
		w, g := want.Tensor(s.Name), got.Tensor(s.Name)
		rel := maxRelErr(g, w)
		t.Logf("%s: %.3g", s.Name, rel)
		if !(rel <= 1e-2) || math.IsNaN(rel) {
			t.Errorf("%s: %s gradient differs by %.3g of its largest value (limit 1e-2)", s.Name, what, rel)
		}
	}
}

func TestParseGemmTune(t *testing.T) {
	for v, want := range map[string]int{"": gemmCandidates, "off": 0, "1": 1, "32": 32, "64": 64} {
		if got, err := parseGemmTune(v); err != nil || got != want {
			t.Errorf("parseGemmTune(%q) = %d, %v; want %d", v, got, err, want)
		}
	}
}

// A mistyped engine setting is refused before any device is touched, as
// bad input, with one line naming the variable, the value and what it
// takes, instead of being ignored.
func TestBadEngineSettingIsBadInput(t *testing.T) {
	gemm := []string{"off", "1 to 64"}
	for _, c := range []struct {
		name, value string
		says        []string
	}{
		{"KILN_CUDA_GEMM_TUNE", "0", gemm}, {"KILN_CUDA_GEMM_TUNE", "65", gemm},
		{"KILN_CUDA_GEMM_TUNE", "on", gemm}, {"KILN_CUDA_GEMM_TUNE", "-3", gemm},
		{"KILN_CUDA_ATTENTION", "naïve", nil}, {"KILN_CUDA_ATTENTION", "off", nil},
		{"KILN_CUDA_FORCE_SM80", "yes", nil}, {"KILN_CUDA_FORCE_SM80", "true", nil},
		{"KILN_CUDA_FLASH_FWD", "256", []string{"64", "128"}}, {"KILN_CUDA_FLASH_FWD", "flash", []string{"64", "128"}},
		{"KILN_CUDA_FLASH_BWD", "one", []string{"fused", "split"}}, {"KILN_CUDA_FLASH_BWD", "2", []string{"fused", "split"}},
		{"KILN_CUDA_FLASH_PAIR", "yes", []string{"on", "off"}},
		{"KILN_CUDA_DRESID", "fp16", []string{"fp32", "bf16"}},
		{"KILN_CUDA_GRAPH", "0", []string{"on", "off"}}, {"KILN_CUDA_GRAPH", "eager", []string{"on", "off"}},
	} {
		t.Run(c.name+"="+c.value, func(t *testing.T) {
			t.Setenv(c.name, c.value)
			_, err := ParseOptions(os.Getenv)
			var bad interface{ BadInput() bool }
			if !errors.As(err, &bad) || !bad.BadInput() {
				t.Fatalf("error %v, want bad input", err)
			}
			for _, want := range append([]string{c.name, strconv.Quote(c.value)}, c.says...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("%q does not say %q", err, want)
				}
			}
		})
	}
}
