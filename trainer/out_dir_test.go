package trainer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
)

// A run pointed at a token store's or a tokenizer's directory is refused
// before it writes anything there: its checkpoints and metrics would mix
// with the files that ingest and the catalog own.
func TestARunIsNotWrittenIntoAStoreOrATokenizer(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	for _, c := range []struct{ file, what string }{{tokens.ManifestFile, "a token store"}, {TokenizerFile, "a tokenizer"}} {
		// As the data directory lays them out: tokens/<store>, tokenizers/<name>.
		out := filepath.Join(t.TempDir(), map[string]string{tokens.ManifestFile: "tokens", TokenizerFile: "tokenizers"}[c.file], "x")
		if err := os.MkdirAll(out, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(out, c.file), []byte(`{}`), 0o644); err != nil {
			t.Fatal(err)
		}
		before := treeDigest(t, out)
		_, err := Run(context.Background(), Config{Run: testRun(2), Out: out, Data: newSliceData(vocab, 20000)}, Hooks{})
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), c.what) || !strings.Contains(err.Error(), "--out") {
			t.Errorf("a run into %s: %v; want bad input naming it and --out", c.what, err)
		}
		if after := treeDigest(t, out); after != before {
			t.Errorf("the refused run wrote into %s:\n%s", c.what, after)
		}
	}
}

// A run pointed at a checkpoint's directory (typed to resume from it) is
// refused before it writes anything there, saying how a resume is asked:
// it started a new run nested among the checkpoint's files.
func TestARunIsNotWrittenIntoACheckpoint(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	run := t.TempDir()
	rc := testRun(2)
	rc.CheckpointEvery = 2
	if _, err := Run(context.Background(), Config{Run: rc, Out: run, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(run, StepDir(2))
	before := treeDigest(t, ck)
	_, err := Run(context.Background(), Config{Run: testRun(2), Out: ck, Data: newSliceData(vocab, 20000)}, Hooks{})
	if want := "to go on from its run's checkpoints give --out " + run + " with --resume"; err == nil || !isBadInput(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("a run into checkpoint %s: %v; want bad input saying %q", ck, err, want)
	}
	if after := treeDigest(t, ck); after != before {
		t.Errorf("the refused run wrote into the checkpoint:\n%s", after)
	}
}

// A tokenizer.json the user keeps beside their runs does not make the
// directory a published tokenizer's.
func TestARunMayShareADirectoryWithALooseTokenizer(t *testing.T) {
	requireCPU(t)
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, TokenizerFile), []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(context.Background(), Config{Run: testRun(2), Out: out, Data: newSliceData(model.Presets["tiny"].VocabSize, 20000)}, Hooks{}); err != nil {
		t.Fatal(err)
	}
}

// A run that diverges before its first checkpoint has nothing to resume
// from, and says so instead of pointing at a checkpoint.
func TestDivergingBeforeAnyCheckpointSaysToStartAgain(t *testing.T) {
	msg := (&NonFiniteError{Step: 3, Loss: 1}).Error()
	if strings.Contains(msg, "resume from it") || !strings.Contains(msg, "from step 0") {
		t.Errorf("divergence before a checkpoint: %q", msg)
	}
	msg = (&NonFiniteError{Step: 30, Loss: 1, LastGood: "runs/x/step-0000020"}).Error()
	if !strings.Contains(msg, "runs/x/step-0000020: resume from it") {
		t.Errorf("divergence after a checkpoint: %q", msg)
	}
}
