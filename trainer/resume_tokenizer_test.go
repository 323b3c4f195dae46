package trainer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// treeDigest is every file under dir with its size and SHA-256, one a line,
// so that a test can tell whether anything under a run directory changed.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		lines = append(lines, fmt.Sprintf("%s %d %x", rel, len(b), sha256.Sum256(b)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// A run's configuration changed to another tokenizer of the same vocabulary
// size: the model's shape matches, so only the tokenizer.json its
// checkpoints carry shows the change. The resume is refused naming both
// tokenizers and what to do, and leaves the run as it was; the run's own
// tokenizer resumes it, and the name the checkpoint recorded travels on.
func TestResumeWithAnotherTokenizerIsRefused(t *testing.T) {
	requireCPU(t)
	out := t.TempDir()
	vocab := model.Presets["tiny"].VocabSize
	tokA := []byte(`{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}}}`)
	tokB := []byte(`{"version": "1.0", "model": {"type": "BPE", "vocab": {"b": 0}}}`)
	short := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:6]) }

	res, err := Run(context.Background(), Config{Run: testRun(3), Out: out, Data: newSliceData(vocab, 20000),
		Tokenizer: tokA, TokenizerName: "mix-a"}, Hooks{})
	if err != nil || res.Step != 3 {
		t.Fatalf("first run: step %d, %v", res.Step, err)
	}
	before := treeDigest(t, out)

	_, err = Run(context.Background(), Config{Run: testRun(6), Out: out, Resume: true, Data: newSliceData(vocab, 20000),
		Tokenizer: tokB, TokenizerName: "mix-b"}, Hooks{})
	if err == nil || !isBadInput(err) {
		t.Fatalf("resume with another tokenizer: want a bad-input error, got %v", err)
	}
	for _, want := range []string{StepDir(3), "step 3", "mix-a (sha256 " + short(tokA) + ")", "mix-b (sha256 " + short(tokB) + ")",
		"resume with the tokenizer the run was trained with", "--out"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	if after := treeDigest(t, out); after != before {
		t.Errorf("the refused resume changed %s:\n%s\nbecame\n%s", out, before, after)
	}

	// Unnamed, the run's own tokenizer resumes it and keeps its name.
	res, err = Run(context.Background(), Config{Run: testRun(5), Out: out, Resume: true, Data: newSliceData(vocab, 20000),
		Tokenizer: tokA}, Hooks{})
	if err != nil || res.Step != 5 {
		t.Fatalf("resume with the run's tokenizer: step %d, %v", res.Step, err)
	}
	ck := filepath.Join(out, StepDir(5))
	if b, err := os.ReadFile(filepath.Join(ck, TokenizerFile)); err != nil || string(b) != string(tokA) {
		t.Errorf("%s holds %q (%v), want the run's tokenizer", TokenizerFile, b, err)
	}
	var st State
	if b, err := os.ReadFile(filepath.Join(ck, StateFile)); err != nil || json.Unmarshal(b, &st) != nil || st.TokenizerName != "mix-a" {
		t.Errorf("%s records tokenizer %q (%v), want mix-a", StateFile, st.TokenizerName, err)
	}
}
