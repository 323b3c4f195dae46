package trainer

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokenizer"
)

// The sane-generation gate's sample of a model whose vocabulary is larger
// than its tokenizer's (a tokenizer that learned fewer merges than asked,
// on a small mixture) draws only ids the tokenizer has, as `sched
// generate` does, where an early model's draw of an id past the tokenizer
// left the gate without a sample.
func TestASampleDrawsOnlyIdsItsTokenizerHas(t *testing.T) {
	text := strings.Repeat("package main\n\nimport (\n\t\"fmt\"\n)\n\nfunc main() { fmt.Println(\"hi\") }\n", 20)
	tj, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(text)}, tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(tj)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := model.Preset("tiny")
	c.Layers = 1
	if tok.VocabSize() >= c.VocabSize {
		t.Fatalf("the tokenizer has %d ids, the model %d: the test needs fewer", tok.VocabSize(), c.VocabSize)
	}
	s := &Snapshot{Config: c, Params: model.InitParams(c, 5), Optimizer: &model.OptimizerState{Step: 1},
		Tokenizer: tj, State: State{Step: 1, Run: RunConfig{Model: "tiny", Seq: 16}}}
	s.Optimizer.M, s.Optimizer.V = make([]float32, len(s.Params.Data)), make([]float32, len(s.Params.Data))
	dir, err := WriteCheckpoint(context.Background(), t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	ids, text2, err := Sample(context.Background(), dir, tok)
	if err != nil {
		t.Fatalf("sample of a model of %d ids with a tokenizer of %d: %v", c.VocabSize, tok.VocabSize(), err)
	}
	if len(ids) != 256 {
		t.Errorf("%d ids drawn, want 256", len(ids))
	}
	for i, id := range ids {
		if int(id) >= tok.VocabSize() {
			t.Fatalf("id %d at %d is past the tokenizer's %d", id, i, tok.VocabSize())
		}
	}
	if !strings.HasPrefix(text2, SamplePrompt) {
		t.Errorf("the sample does not begin with its prompt: %q", text2)
	}
}
