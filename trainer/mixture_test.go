package trainer

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
)

// makeStore appends n pseudo-random ids below vocab (ending with EOS 0) to
// a new store through the real appender.
func makeStore(t *testing.T, vocab, n int, seed uint64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	tok := tokens.Tokenizer{Name: "test", SHA256: strings.Repeat("ab", 32), VocabSize: vocab, EOS: 0}
	a, err := tokens.OpenAppender(context.Background(), dir, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ids := make([]uint32, n)
	x := seed
	for i := range ids[:n-1] {
		x = x*6364136223846793005 + 1442695040888963407
		ids[i] = uint32(1 + (x>>33)%uint64(vocab-1))
	}
	b := tokens.Encode(nil, tokens.DtypeFor(vocab), ids)
	if _, err := a.Append(context.Background(), tokens.ShardInfo{ID: "s0", Source: "test"}, bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRunOnTokenStoresResumesExactly(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	// Large enough that each holds out several windows of 33 (1 in 1000).
	code, web := makeStore(t, mc.VocabSize, 400000, 1), makeStore(t, mc.VocabSize, 300000, 2)
	rc := testRun(4)
	rc.Mixture = []MixtureEntry{{Store: code, Weight: 0.7}, {Store: web, Weight: 0.3}}
	rc.EvalEvery = 2
	open := func() *Mixture {
		m, err := OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	_, want, err := runCollect(t, context.Background(), Config{Run: rc, Out: t.TempDir(), Data: open()}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if want[2].EvalLoss == nil || !finite(*want[2].EvalLoss) {
		t.Errorf("no evaluation loss at step 2: %+v", want[2])
	}
	out := t.TempDir()
	if _, _, err := runCollect(t, context.Background(), Config{Run: rc, Out: out, Data: open(), MaxSteps: 2}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	_, got, err := runCollect(t, context.Background(), Config{Run: rc, Out: out, Data: open(), Resume: true}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	for step := 3; step <= 4; step++ {
		if got[step].LossOr(-1) != want[step].LossOr(-1) {
			t.Errorf("step %d: resumed loss %v, uninterrupted %v", step, got[step].LossOr(-1), want[step].LossOr(-1))
		}
	}
	if got[4].EvalLoss == nil || *got[4].EvalLoss != *want[4].EvalLoss {
		t.Errorf("step 4: resumed evaluation %v, uninterrupted %v", got[4].EvalLoss, *want[4].EvalLoss)
	}
}

func TestOpenMixtureRefusesUnfitStores(t *testing.T) {
	mc := model.Presets["tiny"]
	big := makeStore(t, 2*mc.VocabSize, 10000, 3)
	_, err := OpenMixture([]MixtureEntry{{Store: big, Weight: 1}}, mc, 32, 1)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), big) || !strings.Contains(err.Error(), "vocab_size 4096") {
		t.Errorf("store of a larger vocabulary: want a bad-input error naming %s, got %v", big, err)
	}
	short := makeStore(t, mc.VocabSize, 20, 4)
	_, err = OpenMixture([]MixtureEntry{{Store: short, Weight: 1}}, mc, 32, 1)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), short) || !strings.Contains(err.Error(), "seq_len") {
		t.Errorf("store shorter than a window: want a bad-input error naming %s, got %v", short, err)
	}
	missing := filepath.Join(t.TempDir(), "absent")
	_, err = OpenMixture([]MixtureEntry{{Store: missing, Weight: 1}}, mc, 32, 1)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("absent store: want an error naming %s, got %v", missing, err)
	}
}

// onlyData hides a Data's per-store evaluation.
type onlyData struct{ Data }

// A run of several stores logs each store's own held-out loss beside the
// mixed one, the same at every evaluation for the same weights, and the
// per-store evaluation changes neither the training nor the mixed loss.
func TestEachStoresHeldOutLossIsLogged(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	// Large enough that each holds out several windows of 33 (1 in 1000).
	code, web := makeStore(t, mc.VocabSize, 400000, 1), makeStore(t, mc.VocabSize, 300000, 2)
	rc := testRun(4)
	rc.EvalEvery, rc.EvalBatches = 2, 2
	rc.Mixture = []MixtureEntry{{Store: code, Weight: 2}, {Store: web, Weight: 1}}
	run := func(hide bool) map[int]Metrics {
		d, err := OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
		if err != nil {
			t.Fatal(err)
		}
		var data Data = d
		if hide {
			data = onlyData{d}
		}
		_, got, err := runCollect(t, context.Background(), Config{Run: rc, Out: t.TempDir(), Data: data}, Hooks{})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got, plain := run(false), run(true)
	for _, step := range []int{2, 4} {
		by := got[step].EvalLossByStore
		if len(by) != 2 || by[code] <= 0 || by[web] <= 0 || by[code] == by[web] {
			t.Errorf("step %d: per-store losses %v; want one for each of the two stores", step, by)
		}
		if *got[step].EvalLoss != *plain[step].EvalLoss || plain[step].EvalLossByStore != nil {
			t.Errorf("step %d: mixed eval %v with per-store evaluation, %v without", step, *got[step].EvalLoss, *plain[step].EvalLoss)
		}
	}
	for step := 1; step <= 4; step++ {
		if got[step].LossOr(-1) != plain[step].LossOr(-1) {
			t.Errorf("step %d: training loss %v with per-store evaluation, %v without", step, got[step].LossOr(-1), plain[step].LossOr(-1))
		}
	}
}

// A run that evaluates on stores too small to hold out a window is refused
// before its first step, naming what to do, and leaves nothing behind:
// before, it trained eval_every steps and failed at the evaluation with no
// checkpoint written.
func TestRunRefusesEvaluationWithoutHeldOutWindowsAtOnce(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	// 5,000 ids are 151 windows of 33: none of them held out (1 in 1000).
	rc := testRun(6)
	rc.Mixture = []MixtureEntry{{Store: makeStore(t, mc.VocabSize, 5000, 3), Weight: 1}}
	rc.EvalEvery, rc.CheckpointEvery = 3, 3
	m, err := OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	steps := 0
	res, _, err := runCollect(t, context.Background(), Config{Run: rc, Out: out, Data: m}, Hooks{Step: func(int, int) { steps++ }})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !strings.Contains(err.Error(), "held-out") || !strings.Contains(err.Error(), "eval-every 0") {
		t.Fatalf("evaluation without held-out windows: %+v, %v; want bad input naming the held-out windows and --eval-every 0", res, err)
	}
	if steps != 0 || res.Step != 0 {
		t.Errorf("%d steps trained (result %+v) before the refusal; want none", steps, res)
	}
	if left, _ := filepath.Glob(filepath.Join(out, "*")); len(left) != 0 {
		t.Errorf("the refused run left %v in its directory", left)
	}
	// Without evaluations the same stores train.
	rc.EvalEvery = 0
	m, err = OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	if res, _, err = runCollect(t, context.Background(), Config{Run: rc, Out: out, Data: m}, Hooks{}); err != nil || !res.Done {
		t.Fatalf("the same stores with eval_every 0: %+v, %v", res, err)
	}
}
