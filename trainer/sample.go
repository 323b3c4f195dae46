package trainer

import (
	"context"
	"fmt"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokenizer"
)

// SamplePrompt starts the sane-generation gate's sample: a code model
// should continue it with an import list.
const SamplePrompt = "package main\n\nimport (\n"

// Sample generates the sane-generation gate's sample from checkpoint dir:
// 256 tokens after SamplePrompt, on the CPU engine whatever the run trained
// on (a few seconds for the presets' models), seeded so that the same
// weights always give the same text. It draws only ids the tokenizer has,
// as `sched generate` does: a model's vocabulary may be larger than its
// tokenizer's, whose ids past it an early model still gives weight to. It
// returns the generated ids, which the gate reads, and the prompt with
// their text.
func Sample(ctx context.Context, dir string, tok *tokenizer.Tokenizer) ([]int32, string, error) {
	snap, err := ReadCheckpoint(dir, nil)
	if err != nil {
		return nil, "", err
	}
	eng, err := model.NewEngine("cpu", snap.Config, model.Options{Precision: "fp32", MaxBatch: 1, MaxSeq: snap.Config.MaxPositions})
	if err != nil {
		return nil, "", fmt.Errorf("sample from %s: %w", dir, err)
	}
	defer eng.Close()
	if err := eng.SetParams(snap.Params); err != nil {
		return nil, "", fmt.Errorf("sample from %s: %w", dir, err)
	}
	var ids []int32
	for _, id := range tok.Encode(SamplePrompt) {
		ids = append(ids, int32(id))
	}
	gen, err := eng.Generate(ctx, ids, 256, -1, model.Sampling{Temperature: 0.8, TopK: 40, Seed: 1, Vocab: tok.VocabSize()})
	if err != nil {
		return nil, "", fmt.Errorf("sample from %s: %w", dir, err)
	}
	u := make([]uint32, len(gen))
	for i, id := range gen {
		u[i] = uint32(id)
	}
	text, err := tok.Decode(u)
	if err != nil {
		return gen, "", fmt.Errorf("sample from %s: %w", dir, err)
	}
	return gen, SamplePrompt + text, nil
}
