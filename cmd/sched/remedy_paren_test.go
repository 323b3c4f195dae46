package main

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/trainer"
)

// A message that ends in ")" keeps, cut to its line, its own last clause,
// not one inside its closing parenthesis: the last byte was never read, so
// that parenthesis stayed open and the "; " inside it was taken for the
// message's, and a refused resume of another model shape read
// "…; queued: a run of another name)" on every one-line view.
func TestKeepRemedyOfAMessageEndingInAParenthesis(t *testing.T) {
	const id = "train:segment:64f0ceb674e32abf4802"
	for _, c := range []struct {
		msg  string
		n    int
		want string
	}{
		// Ending in ")", the last clause after a "; ", and after a ": ".
		{"a b c d e f g h i j k l m n o p q r s t; do this (or: that; or the other)", 60, "a b c d e f g h i j k l m…; do this (or: that; or the other)"},
		{"wait for x y z w v u t s r q p (file f: bad): mend it (see g)", 40, "wait for x y z w v u t…: mend it (see g)"},
		// Not ending in ")", as before.
		{"a b c d e f g h i j k l m n o p q r s t u; do this", 30, "a b c d e f g h i j …; do this"},
		{"a b c d e f g h i j k l m n o p q r s t u; do this;", 30, "a b c d e f g h i j…; do this;"},
		{"a b c d e f g h i j k l m n o p: do this:", 30, "a b c d e f g h i j…: do this:"},
	} {
		if got := keepRemedy(c.msg, c.n, id); got != c.want {
			t.Errorf("keepRemedy(%q, %d):\n%q\nwant\n%q", c.msg, c.n, got, c.want)
		}
	}

	// A resume refused for another model shape, as the worker's segment
	// and `sched enqueue train` word it: the fields that differ, then what
	// to do, which each view keeps whole. It gave both models' every
	// field, and what to do cut short: no view could reach it.
	moe := trainer.RunConfig{Model: "tiny", Seq: 32, Batch: 4, TotalSteps: 300, Seed: 1,
		Mixture: []trainer.MixtureEntry{{Store: "gosrc", Weight: 1}}, MoE: &trainer.MoEConfig{Experts: 4, TopK: 2, DFF: 64}}.WithDefaults()
	dense := moe
	dense.MoE = nil
	refused := trainer.CheckResume("/srv/kiln/runs/moe-d/step-0000400", trainer.State{Step: 400, Run: moe}, dense, tokens.Tokenizer{})
	if refused == nil {
		t.Fatal("a MoE checkpoint resumed dense is not refused")
	}
	msg := "train:segment: run moe-d: resume from step 400: " + refused.Error()
	const fix = "give the run the model it was trained with"
	if i, sep := remedyAt(msg); sep != ": " || !strings.HasPrefix(msg[i:], ": "+fix) {
		t.Errorf("remedyAt(%q) = %d %q, at %q; want the \": \" before %q", msg, i, sep, msg[max(i, 0):], fix)
	}
	task := scheduler.TaskStatus{ID: id, Kind: scheduler.KindTrainSegment, Queue: "gpu", State: "archived", MaxRetry: 3, LastErr: msg}
	v := runView{RunState: scheduler.RunState{Run: "moe-d", Step: 400, Total: 3000, Checkpoint: 400}, HasState: true, Task: &task}
	v.classify()
	for view, line := range map[string]string{"RUNS": v.Detail, "FAILURES": failureLine(task), "sched runs": outcomeLine(task)} {
		if !strings.HasSuffix(line, ": "+fix+", or train a run of another name (sched train: another --out)") {
			t.Errorf("%s shows the refused resume as %q; want what to do, whole", view, line)
		}
	}
}
