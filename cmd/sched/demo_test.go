package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/kernels"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// The demo end to end on a small corpus (300k tokens of the standard
// library) and a short run: tokenizer, ingest, training through the in-process
// queue, results, plot and sample. The two-minute run and its loss drop
// are recorded in docs/benchmarks/demo.md.
func TestDemoRunsThePipeline(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	res, err := runDemo(context.Background(), &out, demoOptions{
		Dir: dir, Files: filepath.Join(runtime.GOROOT(), "src", "*", "*.go"), Duration: 5 * time.Second,
		Engine: "cpu", TokenizerBytes: 256 << 10, MaxTokens: 300_000, MinSteps: 15, Quiet: true,
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if res.TotalSteps < 15 || res.CorpusTokens <= 0 {
		t.Fatalf("run of %d steps on %d tokens", res.TotalSteps, res.CorpusTokens)
	}
	f := res.Figures
	if !f.HaveEval || f.FirstEvalLoss < 7 || f.FinalEvalLoss >= f.FirstEvalLoss || f.Steps < res.TotalSteps-5 {
		t.Fatalf("figures %+v", f)
	}
	svg, err := os.ReadFile(res.PlotPath)
	if err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Fatalf("plot %s: %v", res.PlotPath, err)
	}
	md, err := os.ReadFile(res.SummaryPath)
	if err != nil || !bytes.Contains(md, []byte("| sane generation ")) {
		t.Fatalf("summary %s: %v\n%s", res.SummaryPath, err, md)
	}
	if !strings.HasPrefix(res.Sample, "package main\n\nimport (\n") || len(res.Sample) < 100 {
		t.Fatalf("sample %q", res.Sample)
	}
	var printed bytes.Buffer
	printDemo(&printed, res)
	for _, want := range []string{"| first eval loss", "eval loss fell from", res.PlotPath, "a sample from the final checkpoint"} {
		if !strings.Contains(printed.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, printed.String())
		}
	}
	if !strings.Contains(out.String(), "==> train: model tiny") {
		t.Errorf("progress output:\n%s", out.String())
	}
}

func TestDemoBadInput(t *testing.T) {
	t.Parallel()
	_, errOut, code := sched(t, nil, "demo", "--dir", t.TempDir(), "--files", filepath.Join(t.TempDir(), "*.nothing"))
	if code != 2 || !strings.Contains(errOut, "matches no files") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("exit %d, %q", code, errOut)
	}
	_, errOut, code = sched(t, nil, "demo", "--dir", t.TempDir(), "--files", "[")
	if code != 2 || !strings.Contains(errOut, `--files "[" is not a glob`) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("--files [: exit %d, %q", code, errOut)
	}
	// Refused before anything is made: --dir stays empty.
	dir := t.TempDir()
	for _, c := range []struct{ args, want string }{
		{"--duration -1m", "--duration"},
		{"--duration 0", "--duration 0s: give a training time"},
		{"--engine gpu", `--engine "gpu": give cuda, cpu or auto`},
	} {
		_, errOut, code := sched(t, nil, append([]string{"demo", "--dir", dir}, strings.Fields(c.args)...)...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("demo %s: exit %d, %q; want exit 2 and %q", c.args, code, errOut, c.want)
		}
	}
	// --engine cuda where no GPU starts is refused in one line before
	// the ingest and the tokenizer, not after them.
	if _, err := kernels.ProbeHost(); err != nil {
		_, errOut, code := sched(t, nil, "demo", "--dir", dir, "--engine", "cuda")
		if code != 2 || !strings.HasPrefix(errOut, "sched: --engine cuda: ") || !strings.Contains(errOut, "--engine cpu") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("demo --engine cuda without a GPU: exit %d, %q; want exit 2 and one line saying why and what to use", code, errOut)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused demos wrote %d entries into --dir", len(entries))
	}
	// A --dir holding a tokenizer.json the demo did not write (a model's
	// directory): refused, and the file kept, where the demo learned its
	// own and wrote it over the user's.
	model := t.TempDir()
	theirs := []byte(`{"model": {"type": "BPE"}, "the user's": true}`)
	if err := os.WriteFile(filepath.Join(model, "tokenizer.json"), theirs, 0o644); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, nil, "--dir "+model+" holds tokenizer.json that no sched demo wrote: the demo replaces what its directory holds, so give it a new or empty directory (--dir)",
		"demo", "--dir", model, "--engine", "cpu")
	if b, err := os.ReadFile(filepath.Join(model, "tokenizer.json")); err != nil || !bytes.Equal(b, theirs) {
		t.Errorf("the user's tokenizer.json after the refused demo: %q, %v", b, err)
	}
	// A corpus of empty files, and a --dir that is a file.
	empty := filepath.Join(t.TempDir(), "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	if _, errOut, code := sched(t, nil, "demo", "--dir", t.TempDir(), "--files", empty); code != 2 || !strings.Contains(errOut, "hold no text") || strings.Contains(errOut, "\n\t") {
		t.Errorf("demo of an empty file: exit %d, %q; want exit 2 saying it holds no text", code, errOut)
	}
	if _, errOut, code := sched(t, nil, "demo", "--dir", empty); code != 2 || !strings.Contains(errOut, "--dir "+empty) {
		t.Errorf("demo --dir FILE: exit %d, %q; want exit 2 naming it", code, errOut)
	}
	if b, err := os.ReadFile(empty); err != nil || len(b) != 0 {
		t.Errorf("the file given as --dir changed: %q, %v", b, err)
	}
}

func TestFitRunEndsOnAnEvaluation(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		d        time.Duration
		step     time.Duration
		minSteps int
	}{
		{2 * time.Minute, 300 * time.Millisecond, 40}, // 400 steps
		{2 * time.Minute, 273 * time.Millisecond, 40}, // 439 steps
		{2 * time.Minute, 5 * time.Second, 40},        // 24, below minSteps
		{5 * time.Second, time.Second, 15},
		{2 * time.Minute, time.Millisecond / 2, 40},  // a fast GPU
		{time.Nanosecond, 30 * time.Millisecond, 40}, // --duration 1ns: minSteps
	} {
		r, err := runs.Presets().Get(demoRun)
		if err != nil {
			t.Fatal(err)
		}
		fitRun(&r, c.d, c.step, c.minSteps)
		want := max(int(c.d/max(c.step, time.Millisecond)), c.minSteps)
		if r.TotalSteps%r.EvalEvery != 0 || r.TotalSteps < c.minSteps || r.TotalSteps > max(want, c.minSteps+r.EvalEvery) || want-r.TotalSteps > 9 {
			t.Errorf("%v at %v a step: %d steps, evaluation every %d; want a multiple of it within 9 below %d", c.d, c.step, r.TotalSteps, r.EvalEvery, want)
		}
		if r.TotalSteps/r.EvalEvery < 10 || r.Warmup > r.TotalSteps/10+1 || r.Segment.MaxDuration != 2*max(c.d, time.Duration(r.TotalSteps)*c.step) {
			t.Errorf("%v at %v a step: %+v", c.d, c.step, r.RunConfig)
		}
	}
}

// cancelOn is a writer that cancels a context once what is written to it
// contains mark: an interrupt that arrives at a known stage of the demo.
type cancelOn struct {
	mark   string
	cancel context.CancelFunc
	buf    bytes.Buffer
}

func (w *cancelOn) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.mark) {
		w.cancel()
	}
	return len(p), nil
}

// A demo stopped as its training begins says that it stopped and what it
// kept, and exits 130 (not a failure's 1); the next demo reuses the
// tokenizer and the ingested files, appends nothing again, and trains to
// the end.
func TestDemoInterruptedKeepsWhatItMade(t *testing.T) {
	dir := t.TempDir()
	o := demoOptions{Dir: dir, Files: filepath.Join(runtime.GOROOT(), "src", "*", "*.go"), Duration: 3 * time.Second,
		Engine: "cpu", TokenizerBytes: 256 << 10, MaxTokens: 300_000, MinSteps: 10, Quiet: true}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelOn{mark: "==> train:", cancel: cancel}
	_, err := runDemo(ctx, w, o)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted demo: %v, want it cancelled\n%s", err, w.buf.String())
	}
	stopped := demoInterrupted(dir, err)
	if code := exitCode(stopped); code != exitInterrupted {
		t.Errorf("exit code %d, want %d", code, exitInterrupted)
	}
	for _, want := range []string{"demo stopped", dir, "the same command again (its --dir and --files as given) reuses it"} {
		if !strings.Contains(stopped.Error(), want) {
			t.Errorf("%q does not say %q", stopped, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatalf("the tokenizer is not kept: %v", err)
	}
	var out bytes.Buffer
	res, err := runDemo(context.Background(), &out, o)
	if err != nil {
		t.Fatalf("the demo again: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), " 0 files appended this time: the store is full at its limit") || res.Figures.Steps < res.TotalSteps-5 {
		t.Fatalf("the demo again appended files or stopped short (%d of %d steps):\n%s", res.Figures.Steps, res.TotalSteps, out.String())
	}
}
