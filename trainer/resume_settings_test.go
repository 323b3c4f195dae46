package trainer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/model"
)

// A run's settings edited between segments: those a resume may change
// train on from the checkpoint's step with a log line that names each
// change; a run whose length is total_tokens given another number of
// tokens a step is refused, naming what to keep, where it would have
// counted its length in steps of the new size (a larger batch ends such a
// run early, or at once as done, a smaller one trains past its tokens).
func TestResumeWithEditedSettings(t *testing.T) {
	requireCPU(t)
	out := t.TempDir()
	vocab := model.Presets["tiny"].VocabSize
	byTokens := func() RunConfig {
		rc := testRun(0)
		rc.TotalTokens = 6 * int64(rc.TokensPerStep()) // 6 steps of 32 x 2 x 2
		return rc
	}
	if res, err := Run(context.Background(), Config{Run: byTokens(), Out: out, Data: newSliceData(vocab, 20000), MaxSteps: 3}, Hooks{}); err != nil || res.Step != 3 {
		t.Fatalf("first segment: step %d, %v", res.Step, err)
	}
	before := treeDigest(t, out)

	larger := byTokens()
	larger.Batch = 4
	_, err := Run(context.Background(), Config{Run: larger, Out: out, Resume: true, Data: newSliceData(vocab, 20000)}, Hooks{})
	if err == nil || !isBadInput(err) {
		t.Fatalf("resume of a total_tokens run with batch 4 for 2: want a bad-input error, got %v", err)
	}
	for _, want := range []string{StepDir(3), "trained 128 tokens a step (seq 32 x batch 2 x accumulate 2)", "this run gives 256",
		"total_tokens 768", "ends at step 3", "keep seq x batch x accumulate at 128", "total_steps"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if after := treeDigest(t, out); after != before {
		t.Errorf("the refused resume changed %s:\n%s\nbecame\n%s", out, before, after)
	}

	// The same tokens a step, in smaller micro-batches, at another lr.
	edited := byTokens()
	edited.Batch, edited.Accumulate, edited.LR = 1, 4, 5e-4
	core, logs := observer.New(zap.InfoLevel)
	res, err := Run(context.Background(), Config{Run: edited, Out: out, Resume: true, Data: newSliceData(vocab, 20000), Log: zap.New(core)}, Hooks{})
	if err != nil || res.Step != 6 || !res.Done {
		t.Fatalf("resume with batch 1 x accumulate 4 and lr 5e-4: %+v, %v", res, err)
	}
	said := logs.FilterMessageSnippet("settings differ from its checkpoint's").All()
	if len(said) != 1 {
		t.Fatalf("log %v; want one line naming the changed settings", logs.All())
	}
	changed := fmt.Sprint(said[0].ContextMap()["changed"])
	for _, want := range []string{"lr 0.001 -> 0.0005", "batch 2 -> 1", "accumulate 2 -> 4"} {
		if !strings.Contains(changed, want) {
			t.Errorf("the log line's changes %s lack %q", changed, want)
		}
	}
	if slices.ContainsFunc(strings.Fields(changed), func(f string) bool { return strings.HasPrefix(f, "total_steps") }) {
		t.Errorf("the log line names total_steps, which did not change: %s", changed)
	}
}

// A resume with the mixture's stores in another order, or another store in
// the place of one, is refused before anything is written, though the
// stores are of one size and the data cursor fits them: each store would go
// on from another's place. The same stores moved elsewhere, at other
// weights, resume, and the log line names the weights' change.
func TestResumeRefusesTheMixtureOfOtherStores(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	named := func(name string, seed uint64) string {
		dir := filepath.Join(filepath.Dir(makeStore(t, mc.VocabSize, 200000, seed)), name)
		if err := os.Rename(filepath.Join(filepath.Dir(dir), "store"), dir); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	code, web, maths := named("code", 1), named("web", 2), named("maths", 3)
	rc := testRun(6)
	rc.EvalEvery = 0
	rc.Mixture = []MixtureEntry{{Store: code, Weight: 0.7}, {Store: web, Weight: 0.3}}
	dir, open := trainedThreeSteps(t, mc, rc)
	before := treeDigest(t, dir)
	for _, c := range []struct {
		name  string
		mix   []MixtureEntry
		names string
	}{
		{"swapped", []MixtureEntry{{Store: web, Weight: 0.7}, {Store: code, Weight: 0.3}}, "web, code"},
		{"replaced", []MixtureEntry{{Store: code, Weight: 0.7}, {Store: maths, Weight: 0.3}}, "code, maths"},
		{"one left out", []MixtureEntry{{Store: code, Weight: 1}}, "code"},
	} {
		other := rc
		other.Mixture = c.mix
		_, err := Run(context.Background(), Config{Run: other, Out: dir, Resume: true, Data: open(other)}, Hooks{})
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "trained on the stores code, web, in that order; this run names "+c.names) ||
			!strings.Contains(err.Error(), "train a run of another name") {
			t.Errorf("%s: resume %v; want it refused, naming both mixtures", c.name, err)
		}
		if after := treeDigest(t, dir); after != before {
			t.Errorf("%s: the refused resume changed %s", c.name, dir)
		}
	}

	// Moved whole, at other weights: the same stores.
	moved := filepath.Join(t.TempDir(), "code")
	if err := os.Rename(code, moved); err != nil {
		t.Fatal(err)
	}
	again := rc
	again.Mixture = []MixtureEntry{{Store: moved, Weight: 0.5}, {Store: web, Weight: 0.5}}
	core, logs := observer.New(zap.InfoLevel)
	if res, err := Run(context.Background(), Config{Run: again, Out: dir, Resume: true, Data: open(again), Log: zap.New(core)}, Hooks{}); err != nil || !res.Done {
		t.Fatalf("resume from a moved store at other weights: %+v, %v", res, err)
	}
	said := logs.FilterMessageSnippet("settings differ from its checkpoint's").All()
	if len(said) != 1 || !strings.Contains(fmt.Sprint(said[0].ContextMap()["changed"]), "mixture code=0.7,web=0.3 -> code=0.5,web=0.5") {
		t.Errorf("log %v; want one line naming the weights' change", logs.All())
	}
}

// A resume with another seed or sequence length is refused before
// anything is written, naming both and what to give, where the data
// cursor refused it in its own words after a line saying the new
// settings applied.
func TestResumeRefusesAnotherSeedOrSequence(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	store := makeStore(t, mc.VocabSize, 200000, 1)
	rc := testRun(6)
	rc.EvalEvery = 0
	rc.Mixture = []MixtureEntry{{Store: store, Weight: 1}}
	dir, open := trainedThreeSteps(t, mc, rc)
	before := treeDigest(t, dir)
	for _, c := range []struct {
		name string
		seed uint64
		seq  int
	}{{"seed", rc.Seed + 4, rc.Seq}, {"seq", rc.Seed, rc.Seq / 2}} {
		other := rc
		other.Seed, other.Seq = c.seed, c.seq
		core, logs := observer.New(zap.InfoLevel)
		_, err := Run(context.Background(), Config{Run: other, Out: dir, Resume: true, Data: open(other), Log: zap.New(core)}, Hooks{})
		want := fmt.Sprintf("was trained with seed %d and seq %d; this run asks for seed %d and seq %d", rc.Seed, rc.Seq, c.seed, c.seq)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), fmt.Sprintf("Resume with seed %d and seq %d", rc.Seed, rc.Seq)) {
			t.Errorf("resume with another %s: %v; want it refused with %q", c.name, err, want)
		}
		if logs.FilterMessageSnippet("the new ones apply").Len() != 0 {
			t.Errorf("resume with another %s logged that the new settings apply before it was refused", c.name)
		}
		if after := treeDigest(t, dir); after != before {
			t.Errorf("%s: the refused resume changed %s", c.name, dir)
		}
	}
}

// trainedThreeSteps trains rc's first three steps into a new directory and
// returns it, with what opens a run config's mixture for the resumes the
// test tries there.
func trainedThreeSteps(t *testing.T, mc model.Config, rc RunConfig) (dir string, open func(RunConfig) *Mixture) {
	t.Helper()
	dir = t.TempDir()
	open = func(rc RunConfig) *Mixture {
		m, err := OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	if res, err := Run(context.Background(), Config{Run: rc, Out: dir, Data: open(rc), MaxSteps: 3}, Hooks{}); err != nil || res.Step != 3 {
		t.Fatalf("first segment: %+v, %v", res, err)
	}
	return dir, open
}
