package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// A runs entry changed to other stores in its mixture, or to another
// tokenizer (of the same vocabulary size, which the model's shape does not
// show), is refused at enqueue with the worker's own words, read from the
// run's newest checkpoint in object storage: it was queued, said to resume,
// and the worker archived the segment. Without the run's record in Redis
// the checkpoint still says it, and a seq or a model changed too. A step too large
// for any card is not told to take a smaller seq, which a resume refuses.
// A trainer_state.json that is not the one its marker lists (damaged)
// refuses nothing: the worker passes over it. Put back, with only a
// weight changed, the run resumes.
func TestEnqueueTrainRefusesATokenizerOrStoresItsCheckpointsCannotResume(t *testing.T) {
	t.Parallel()
	env, rdb, q, objects := s3TrainingSetup(t, "")
	ctx := context.Background()
	was := "mix:\n  from: eta\n  total_steps: 40\n"
	appendRuns(t, env, was)
	trainToTheEnd(t, env, rdb, q, "mix")
	entry := func(body string) { t.Helper(); editRuns(t, env, was, body); was = body }

	set, err := runs.Load(envValue(env, "KILN_RUNS"))
	if err != nil {
		t.Fatal(err)
	}
	eta, err := set.Get("eta")
	if err != nil {
		t.Fatal(err)
	}
	code := eta.Mixture[0].Store // its directory is named "store"
	tk := setupTokenizer(t, env)
	more := filepath.Join(t.TempDir(), "more")
	if err := os.Rename(trainTestStoreNamed(t, "tk", tk.SHA256, tk.VocabSize, 400_000), more); err != nil {
		t.Fatal(err)
	}
	// Another tokenizer of as many ids, published on this machine, and a
	// store it made, in a directory of the run's store's name.
	text := strings.Repeat("package other\nimport \"os\"\nfunc g(x int) int { return x * 2 } // doubles, writes to stdout\n", 50)
	b, err := tokenizer.Train(ctx, []io.Reader{strings.NewReader(text)}, tokenizer.TrainOptions{VocabSize: tk.VocabSize})
	if err != nil {
		t.Fatal(err)
	}
	tk2, err := tokenizer.Parse(b)
	if err != nil || tk2.VocabSize() != tk.VocabSize {
		t.Fatalf("tokenizer tk2: %v; want %d ids as tk has", err, tk.VocabSize)
	}
	sha := tk2.SHA256()
	if err := os.MkdirAll(filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "tk2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "tk2", "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	byTk2 := trainTestStoreNamed(t, "tk2", sha, tk.VocabSize, 400_000)

	ck := `^sched: run mix: checkpoint checkpoints/mix/step-0000040 \(step 40\) `
	twoStores := "mix:\n  from: eta\n  total_steps: 60\n  mixture:\n    - {store: " + code + ", weight: 1}\n    - {store: " + more + ", weight: 1}\n"
	storesRefused := ck + `trained on the stores store, in that order; this run names store, more: each store's place in the data is kept in that order, ` +
		`so the run would go on with other windows than its own\. Give the mixture its stores as they were, in the same order \(their weights may change\), or train a run of another name\n$`
	entry(twoStores)
	wantBadInput(t, env, storesRefused, "enqueue", "train", "mix")
	entry("mix:\n  from: eta\n  total_steps: 60\n  tokenizer: tk2\n  mixture:\n    - {store: " + byTk2 + ", weight: 1}\n")
	wantBadInput(t, env, ck+`was trained with tokenizer tk \(sha256 `+tk.SHA256[:12]+`\), but this run gives tokenizer tk2 \(sha256 `+sha[:12]+`\): `+
		`their ids mean different text, which the model's shape does not show; resume with the tokenizer the run was trained with`,
		"enqueue", "train", "mix")
	// A step no card holds: the advice keeps the seq its checkpoints hold.
	entry("mix:\n  from: eta\n  total_steps: 60\n  batch: 1000000\n")
	wantBadInput(t, env, `^sched: run mix: batch 1000000 x seq 32 .* needs .* but the largest card kiln supports .*: in a runs file \(KILN_RUNS, here and on the GPU worker\), `+
		`give run mix a smaller batch and a larger accumulate \(the same tokens a step\); its seq stays 32, which its checkpoints \(step 40\) were trained at\n$`,
		"enqueue", "train", "mix")
	if live, err := q.LiveSegment(ctx, "mix"); err != nil || live != nil {
		t.Fatalf("a refused enqueue queued %v (%v)", live, err)
	}

	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	entry(twoStores)
	wantBadInput(t, env, storesRefused, "enqueue", "train", "mix")
	entry("mix:\n  from: eta\n  total_steps: 60\n  seq: 64\n")
	wantBadInput(t, env, ck+`was trained with seed 3 and seq 32; this run asks for seed 3 and seq 64`, "enqueue", "train", "mix")
	// Another model: Redis, which recorded the run's layout, no longer
	// holds it; the checkpoint's trainer_state.json names its model.
	entry("mix:\n  from: eta\n  total_steps: 60\n  model: small\n")
	wantBadInput(t, env, ck+`holds a model of another layout, vocab \d+ \(this run's: vocab \d+\), d_model 64 \(this run's: d_model 512\), .*: give the run the model it was trained with`, "enqueue", "train", "mix")

	// A state of other stores than the marker lists (edited, damaged).
	key := segment.CheckpointPrefix("mix") + trainer.StepDir(40) + "/" + trainer.StateFile
	r, err := objects.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	state, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.ReplaceAll(state, []byte(code), []byte(more))
	if bytes.Equal(edited, state) {
		t.Fatalf("the checkpoint's state does not name store %s:\n%s", code, state)
	}
	if err := objects.Put(ctx, key, bytes.NewReader(edited), int64(len(edited))); err != nil {
		t.Fatal(err)
	}
	entry("mix:\n  from: eta\n  total_steps: 60\n  mixture:\n    - {store: " + code + ", weight: 3}\n")
	if out, errOut, code := sched(t, env, "enqueue", "train", "mix"); code != 0 || !strings.Contains(out, "the run resumes from its last checkpoint (step 40") {
		t.Fatalf("enqueue train mix put back, a weight changed: exit %d, %q %q; want it queued from step 40", code, out, errOut)
	}
}
