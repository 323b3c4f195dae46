package runs

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
)

// The advice on a run's step too large for its memory names the runs
// file's fields to change: a smaller batch with a larger accumulate, or a
// smaller seq. A run resumed from a checkpoint is not offered the smaller
// seq, which a resume refuses (its data order was drawn at its seq), and
// is told that its seq stays.
func TestSizeAdviceOffersNoOtherSeqToARunWithCheckpoints(t *testing.T) {
	c, err := model.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	plan := model.MemoryPlan{Config: c, Engine: "cpu", Precision: "fp32", Batch: 8000, Seq: 128, Purpose: model.PurposeTrain}
	tooLarge := model.CheckMemory(plan, 16<<30, "this host")
	if tooLarge == nil {
		t.Fatal("a step of batch 8000 x seq 128 fits 16 GiB")
	}
	engine := fmt.Errorf("engine cpu: %w", tooLarge)

	fresh := SizeAdvice("rn", engine).Error()
	if !strings.HasSuffix(fresh, "give run rn a smaller batch and a larger accumulate (the same tokens a step), or a smaller seq") {
		t.Errorf("a fresh run's advice: %q; want a smaller batch and accumulate, or a smaller seq", fresh)
	}
	resumed := SizeAdvice("rn", &trainer.ResumedError{Step: 1000, Err: engine})
	var me *model.MemoryError
	if !errors.As(resumed, &me) || !isBadInput(resumed) {
		t.Fatalf("a resumed run's advice is %T, %v; want the memory error, bad input", resumed, resumed)
	}
	want := "give run rn a smaller batch and a larger accumulate (the same tokens a step); its seq stays 128, which its checkpoints (step 1000) were trained at"
	if got := resumed.Error(); !strings.HasSuffix(got, want) || strings.Contains(got, "smaller seq") {
		t.Errorf("a run resumed from step 1000: %q; want it to end %q, with no smaller seq", got, want)
	}
}
