package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/results"
)

func TestResultsCommand(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	st, err := store.NewLocal(filepath.Join(data, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	recs := []results.Record{
		{Step: 10, Tokens: 5120, Loss: results.F(7.5), EvalLoss: results.F(7.6)},
		{Step: 20, Tokens: 10240, Loss: results.F(6.8), EvalLoss: results.F(6.9)},
		{Step: 30, Tokens: 15360, Loss: results.F(6.1), EvalLoss: results.F(6.2)},
	}
	var md strings.Builder
	s := results.Summary{Run: "pilot", Records: recs, Gates: []results.Gate{results.FallingGate(recs)}}
	if err := s.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(ctx, "results/pilot/summary.md", strings.NewReader(md.String()), int64(md.Len())); err != nil {
		t.Fatal(err)
	}
	bench := `{"model":"small","vocab":16384,"d_model":512,"layers":8,"batch":32,"seq":1024,"tok_per_sec":91234,"peak_memory_bytes":4294967296,"mfu":0.33,"gpu_idle":true,"device":"NVIDIA H200"}` + "\n"
	if err := st.Put(ctx, BenchResultsKey, strings.NewReader(bench), int64(len(bench))); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_DATA_DIR=" + data}

	out, errOut, code := sched(t, env, "results", "pilot")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"# Run pilot", "| final eval loss  | 6.2000", "| still falling ", "| pass ", filepath.Join(data, "objects", "results", "pilot", "loss.svg")} {
		if !strings.Contains(out, want) {
			t.Errorf("results pilot lacks %q:\n%s", want, out)
		}
	}

	out, errOut, code = sched(t, env, "results", "bench")
	if code != 0 || !strings.Contains(out, "91234") || !strings.Contains(out, "| yes ") || !strings.Contains(out, "4.00 GiB") {
		t.Fatalf("results bench: exit %d\n%s\n%s", code, out, errOut)
	}

	_, errOut, code = sched(t, env, "results", "long")
	if code != 2 || !strings.Contains(errOut, `no results for run "long" yet`) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("missing run: exit %d, %q", code, errOut)
	}
	_, errOut, code = sched(t, []string{"KILN_DATA_DIR=" + t.TempDir()}, "results", "bench")
	if code != 2 || !strings.Contains(errOut, "no bench results yet") {
		t.Fatalf("missing bench: exit %d, %q", code, errOut)
	}
	// A name no run has is said to be one, not a run without results yet;
	// the bench sweep has no TensorBoard files to copy.
	_, errOut, code = sched(t, env, "results", "nosuch")
	if code != 2 || !strings.Contains(errOut, `no results for run "nosuch": no run of that name is known here (demo, long, pilot, pilot-cpu`) {
		t.Errorf("unknown run: exit %d, %q", code, errOut)
	}
	tbBench := filepath.Join(t.TempDir(), "tb")
	if _, errOut, code := sched(t, env, "results", "bench", "--tensorboard", tbBench); code != 2 || !strings.Contains(errOut, "the bench sweep has no TensorBoard files") {
		t.Errorf("results bench --tensorboard: exit %d, %q", code, errOut)
	}
	if _, err := os.Stat(tbBench); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("results bench --tensorboard made %s: %v", tbBench, err)
	}
	// --tensorboard copies the run's event files, one per segment.
	for _, name := range []string{"events.out.tfevents.1.gpu.step0", "events.out.tfevents.2.gpu.step20"} {
		body := "event file " + name
		if err := st.Put(ctx, "results/pilot/tensorboard/"+name, strings.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
	}
	tb := filepath.Join(t.TempDir(), "tb")
	out, errOut, code = sched(t, env, "results", "pilot", "--tensorboard", tb)
	if code != 0 || !strings.Contains(out, "tensorboard --logdir "+tb) {
		t.Fatalf("results --tensorboard: exit %d\n%s%s", code, out, errOut)
	}
	for _, name := range []string{"events.out.tfevents.1.gpu.step0", "events.out.tfevents.2.gpu.step20"} {
		if b, err := os.ReadFile(filepath.Join(tb, "pilot", name)); err != nil || string(b) != "event file "+name {
			t.Errorf("%s: %q %v", name, b, err)
		}
	}
	_, errOut, code = sched(t, env, "results", "nosuch", "--tensorboard", tb)
	if code != 2 || !strings.Contains(errOut, `no TensorBoard event files for run "nosuch": no run of that name is known here (demo, long, pilot, pilot-cpu`) {
		t.Errorf("--tensorboard of an unknown run: exit %d, %q; want it said to be no run's name", code, errOut)
	}
	_, errOut, code = sched(t, env, "results", "long", "--tensorboard", tb)
	if code != 2 || !strings.Contains(errOut, `run "long" has no TensorBoard event files yet`) {
		t.Errorf("--tensorboard of a run without results: exit %d, %q", code, errOut)
	}
	_, errOut, code = sched(t, env, "results", "a/b")
	if code != 2 || !strings.Contains(errOut, "no slashes") {
		t.Fatalf("bad name: exit %d, %q", code, errOut)
	}
	// --tensorboard given empty, a file, or a directory kiln owns (a
	// checkpoint's) is refused by name, and nothing is written there.
	file := filepath.Join(t.TempDir(), "keep.txt")
	os.WriteFile(file, []byte("mine"), 0o644)
	ckpt := t.TempDir()
	os.WriteFile(filepath.Join(ckpt, "trainer_state.json"), []byte("{}"), 0o644)
	// A directory whose <run> is a file: that file is named, not the
	// directory, which is one.
	inTheWay := t.TempDir()
	os.WriteFile(filepath.Join(inTheWay, "pilot"), []byte("mine"), 0o644)
	for _, c := range []struct{ dir, want string }{
		{"", "--tensorboard is given empty"},
		{file, "--tensorboard " + file + ": not a directory: give a directory this user can write"},
		{inTheWay, "--tensorboard " + inTheWay + ": " + filepath.Join(inTheWay, "pilot") + ": not a directory: give a directory this user can write (it is made if absent), such as tb, or move " + filepath.Join(inTheWay, "pilot")},
		{ckpt, "--tensorboard " + ckpt + " is in a checkpoint's directory, " + ckpt + ", whose files only training writes"},
	} {
		_, errOut, code = sched(t, env, "results", "pilot", "--tensorboard", c.dir)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("--tensorboard %q: exit %d, %q; want exit 2 and %q", c.dir, code, errOut, c.want)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "mine" {
		t.Errorf("the file given as --tensorboard: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(ckpt, "pilot")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a download into a checkpoint's directory: %v", err)
	}
}
