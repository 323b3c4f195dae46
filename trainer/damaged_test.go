package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A resume whose newest checkpoint was damaged after it was written sets it
// aside, with a warning that names it, and continues from the one before:
// the losses from there on are the uninterrupted run's, and the damaged
// files stay, unchanged, beside the run.
func TestResumeSetsADamagedCheckpointAside(t *testing.T) {
	requireCPU(t)
	ctx := context.Background()
	vocab := model.Presets["tiny"].VocabSize
	const total = 6
	run := func() RunConfig {
		rc := testRun(total)
		rc.CheckpointEvery = 2
		return rc
	}
	_, want, err := runCollect(t, ctx, Config{Run: run(), Out: t.TempDir(), Data: newSliceData(vocab, 20000)}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}

	for name, spoil := range map[string]func(dir string){
		"a flipped byte": func(dir string) {
			f, err := os.OpenFile(filepath.Join(dir, ModelFile), os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte{0xa5, 0x5a}, 300)
			f.Close()
		},
		"a truncated file": func(dir string) { os.Truncate(filepath.Join(dir, OptimizerFile), 1000) },
		"no state file":    func(dir string) { os.Remove(filepath.Join(dir, StateFile)) },
		// trainer_state.json has no hash of its own; values no run writes
		// give it away.
		"a negative step":            func(dir string) { editState(t, dir, "step", -3) },
		"a step not its directory's": func(dir string) { editState(t, dir, "step", 99999999) },
		"negative tokens seen":       func(dir string) { editState(t, dir, "tokens_seen", -1) },
	} {
		t.Run(name, func(t *testing.T) {
			out := t.TempDir()
			bounded := Config{Run: run(), Out: out, Data: newSliceData(vocab, 20000), MaxSteps: 4}
			if res, _, err := runCollect(t, ctx, bounded, Hooks{}); err != nil || res.Step != 4 {
				t.Fatalf("bounded run: %+v, %v", res, err)
			}
			newest := filepath.Join(out, StepDir(4))
			spoil(newest)
			before := readDir(t, newest)

			core, logs := observer.New(zap.WarnLevel)
			resumed := Config{Run: run(), Out: out, Data: newSliceData(vocab, 20000), Resume: true, Log: zap.New(core)}
			res, got, err := runCollect(t, ctx, resumed, Hooks{})
			if err != nil || !res.Done || res.Step != total {
				t.Fatalf("resumed run: %+v, %v", res, err)
			}
			if _, ok := got[2]; ok || got[3].Step != 3 {
				t.Fatalf("resumed run logged steps %v; want it to continue from step 2", keys(got))
			}
			for step := 3; step <= total; step++ {
				if got[step].LossOr(-1) != want[step].LossOr(-1) {
					t.Errorf("step %d: resumed loss %v, uninterrupted %v", step, got[step].LossOr(-1), want[step].LossOr(-1))
				}
			}
			warned := logs.FilterMessageSnippet("damaged checkpoint set aside").All()
			if len(warned) != 1 || warned[0].ContextMap()["checkpoint"] != newest || warned[0].ContextMap()["now"] != newest+".damaged" {
				t.Fatalf("warnings %v; want one naming %s and where it went", logs.All(), newest)
			}
			if after := readDir(t, newest+".damaged"); !equalFiles(before, after) {
				t.Errorf("the damaged checkpoint's files changed when set aside")
			}
			// The run wrote step 4 again, whole, and ended at its last step.
			if latest, _, err := LatestIntactCheckpoint(out, zap.NewNop()); err != nil || filepath.Base(latest) != StepDir(total) {
				t.Errorf("latest intact checkpoint %s, %v", latest, err)
			}
			if _, err := VerifyCheckpoint(newest); err != nil {
				t.Errorf("step 4 written again: %v", err)
			}
		})
	}
}

// A resume that finds every checkpoint damaged stops, naming the run
// directory and how to start over, rather than training from step 0 and
// overwriting the run's metrics: the checkpoints stay set aside.
func TestResumeWithEveryCheckpointDamagedStops(t *testing.T) {
	requireCPU(t)
	ctx := context.Background()
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(4)
	rc.CheckpointEvery = 2
	out := t.TempDir()
	if res, err := Run(ctx, Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil || res.Step != 4 {
		t.Fatalf("run: %+v, %v", res, err)
	}
	for _, step := range []int{2, 4} {
		os.Truncate(filepath.Join(out, StepDir(step), ModelFile), 100)
	}
	metrics, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(ctx, Config{Run: rc, Out: out, Resume: true, Data: newSliceData(vocab, 20000)}, Hooks{})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !strings.Contains(err.Error(), "every checkpoint in "+out+" is damaged") ||
		!strings.Contains(err.Error(), "without --resume") {
		t.Fatalf("resume: %v; want bad input naming %s and how to start over", err, out)
	}
	for _, step := range []int{2, 4} {
		if _, err := os.Stat(filepath.Join(out, StepDir(step)+".damaged")); err != nil {
			t.Errorf("step %d not set aside: %v", step, err)
		}
	}
	if after, _ := os.ReadFile(filepath.Join(out, "metrics.jsonl")); !bytes.Equal(after, metrics) {
		t.Errorf("metrics.jsonl changed by the refused resume")
	}
	// The run starts over when asked to.
	if res, err := Run(ctx, Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil || res.Step != 4 {
		t.Fatalf("run again without resume: %+v, %v", res, err)
	}
}

// editState sets key in dir's trainer_state.json to v, leaving the other
// files and their hashes as they are.
func editState(t *testing.T, dir, key string, v any) {
	t.Helper()
	path := filepath.Join(dir, StateFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	st[key] = v
	b, _ = json.Marshal(st)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A checkpoint of a format this build does not read is not damaged: the
// resume stops with the reason, and moves nothing.
func TestResumeLeavesACheckpointOfAnotherFormatInPlace(t *testing.T) {
	requireCPU(t)
	ctx := context.Background()
	out := t.TempDir()
	vocab := model.Presets["tiny"].VocabSize
	if _, err := Run(ctx, Config{Run: testRun(1), Out: out, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(out, StepDir(1))
	editState(t, dir, "version", stateVersion+1)
	_, err := Run(ctx, Config{Run: testRun(2), Out: out, Resume: true, Data: newSliceData(vocab, 20000)}, Hooks{})
	if err == nil || !strings.Contains(err.Error(), "written by a newer kiln") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("want an error naming %s and the versions, got %v", dir, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("the checkpoint moved: %v", err)
	}
	if aside, _ := filepath.Glob(dir + ".damaged*"); len(aside) != 0 {
		t.Errorf("set aside: %v", aside)
	}
}

func TestSetAsideKeepsEarlierOnes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, StepDir(8))
	for i, want := range []string{".damaged", ".damaged-2", ".damaged-3"} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "mark"), []byte{byte(i)}, 0o644)
		got, err := SetAside(dir)
		if err != nil || got != dir+want {
			t.Fatalf("SetAside = %s, %v; want %s", got, err, dir+want)
		}
	}
	for i, suffix := range []string{".damaged", ".damaged-2", ".damaged-3"} {
		if b, err := os.ReadFile(filepath.Join(dir+suffix, "mark")); err != nil || !bytes.Equal(b, []byte{byte(i)}) {
			t.Errorf("%s holds %v, %v; want the %d-th one set aside", suffix, b, err, i+1)
		}
	}
	if _, _, err := LatestIntactCheckpoint(root, zap.NewNop()); err != ErrNoCheckpoint {
		t.Errorf("LatestIntactCheckpoint found %v among directories set aside", err)
	}
}

func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = b
	}
	return files
}

func equalFiles(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for name, x := range a {
		if y, ok := b[name]; !ok || !bytes.Equal(x, y) {
			return false
		}
	}
	return true
}

func keys(m map[int]Metrics) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// A run directory that is a file, or cannot be made, is the caller's to
// fix: refused before the engine is made, naming it; the file is left as
// it was.
func TestRunDirectoryThatCannotBeMadeIsBadInput(t *testing.T) {
	requireCPU(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "afile")
	if err := os.WriteFile(file, []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	vocab := model.Presets["tiny"].VocabSize
	for _, out := range []string{file, filepath.Join(file, "run")} {
		_, err := Run(context.Background(), Config{Run: testRun(1), Out: out, Data: newSliceData(vocab, 20000)}, Hooks{})
		var bad interface{ BadInput() bool }
		if err == nil || !errors.As(err, &bad) || !strings.Contains(err.Error(), "run directory "+out) {
			t.Errorf("out %s: %v; want bad input naming it", out, err)
		}
	}
	if b, _ := os.ReadFile(file); string(b) != "mine" {
		t.Errorf("the file became %q", b)
	}
}
