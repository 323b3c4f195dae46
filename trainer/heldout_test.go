package trainer

import (
	"context"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/model"
)

// A store of the mixture too small for a held-out window (3616 windows of
// 33 ids, 119,328 ids, at seq 32) is left out of the run's evaluation:
// the segment warns of it once as it starts, naming the store, what it
// holds and what it needs, and each evaluation's line names it, so that
// the results can say what the eval loss covers. Before, nothing said so,
// and the mixed eval loss, and the gates judged on it, were the other
// store's alone.
func TestAStoreWithoutAHeldOutWindowIsNamed(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	code, small := makeStore(t, mc.VocabSize, 400000, 1), makeStore(t, mc.VocabSize, 100000, 2)
	rc := testRun(4)
	rc.EvalEvery, rc.EvalBatches = 2, 1
	rc.Mixture = []MixtureEntry{{Store: code, Weight: 0.7}, {Store: small, Weight: 0.3}}
	m, err := OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	res, got, err := runCollect(t, context.Background(), Config{Run: rc, Out: t.TempDir(), Data: m, Log: zap.New(core)}, Hooks{})
	if err != nil || !res.Done {
		t.Fatalf("run over a store without a held-out window: %+v, %v; want it trained (the other store holds some)", res, err)
	}
	warned := logs.FilterMessageSnippet("too few tokens for a held-out window").All()
	if len(warned) != 1 {
		t.Fatalf("warnings %v; want one for the small store", logs.All())
	}
	if f := warned[0].ContextMap(); f["store"] != small || f["tokens"] != int64(100000) || f["needs"] != int64(119328) {
		t.Errorf("the warning's fields %v; want store %s, tokens 100000, needs 119328", f, small)
	}
	if !strings.Contains(warned[0].Message, "eval loss") || !strings.Contains(warned[0].Message, "gates") {
		t.Errorf("the warning %q does not say that the eval loss and the gates leave the store out", warned[0].Message)
	}
	for _, step := range []int{2, 4} {
		if by, left := got[step].EvalLossByStore, got[step].EvalLeftOut; len(by) != 1 || by[code] <= 0 || !slices.Equal(left, []string{small}) {
			t.Errorf("step %d: eval loss by store %v, left out %v; want the large store's alone, the small one named as left out", step, by, left)
		}
	}

	// Two stores that each hold one: no warning, nothing left out.
	rc.Mixture[1].Store = makeStore(t, mc.VocabSize, 300000, 3)
	if m, err = OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed); err != nil {
		t.Fatal(err)
	}
	core, logs = observer.New(zapcore.WarnLevel)
	if _, got, err = runCollect(t, context.Background(), Config{Run: rc, Out: t.TempDir(), Data: m, Log: zap.New(core)}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 || len(got[4].EvalLossByStore) != 2 || got[4].EvalLeftOut != nil {
		t.Errorf("stores that each hold a held-out window: warnings %v, step 4's losses %v, left out %v; want none, both, none", logs.All(), got[4].EvalLossByStore, got[4].EvalLeftOut)
	}
}

// A resume whose sequence length changed is refused for that change, which
// no ingest mends, though the stores hold no held-out window of the new
// length: before, the refusal was for the held-out window, and only once
// the user had set eval_every 0 (or ingested more) did the resume say
// that the seq had changed.
func TestAResumeWithAnotherSeqIsRefusedForTheSeqFirst(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	// 150,000 ids: 4545 windows of 33, some held out; 2307 of 65, none.
	store := makeStore(t, mc.VocabSize, 150000, 4)
	rc := testRun(4)
	rc.EvalEvery, rc.EvalBatches = 2, 1
	rc.Mixture = []MixtureEntry{{Store: store, Weight: 1}}
	out := t.TempDir()
	m, err := OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := Run(context.Background(), Config{Run: rc, Out: out, Data: m, MaxSteps: 2}, Hooks{}); err != nil || res.Step != 2 {
		t.Fatalf("first segment: %+v, %v", res, err)
	}
	longer := rc
	longer.Seq = 64
	if m, err = OpenMixture(longer.Mixture, mc, longer.Seq, longer.Seed); err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Config{Run: longer, Out: out, Data: m, Resume: true}, Hooks{})
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "seed 11 and seq 32; this run asks for seed 11 and seq 64") || strings.Contains(err.Error(), "held-out") {
		t.Fatalf("resume at seq 64 of a run trained at seq 32: %v; want it refused for the seq, not the held-out windows", err)
	}
}
