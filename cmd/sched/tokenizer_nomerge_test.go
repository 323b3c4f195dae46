package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sched tokenizer train on a corpus in which no pair of symbols occurs
// twice refuses, exit 2 and nothing written, saying so and to train on
// more text, where it wrote a tokenizer of no merge, exit 0, and warned
// to ask for 257 ids, a size the same command refuses.
func TestTokenizerTrainRefusesACorpusThatTeachesNoMerge(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("func main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "t.json")
	_, errOut, code := sched(t, nil, "tokenizer", "train", "--in", in, "--vocab", "300", "--out", out)
	want := "sched: tokenizer train: --in " + in + ": the corpus has no pair of symbols seen twice or more, so it teaches no merge"
	if code != exitBadInput || !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, "train on more text") ||
		strings.Contains(errOut, "ask for") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("exit %d, %q; want exit 2 and one line beginning %q that says to train on more text", code, errOut, want)
	}
	if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("--out after the refusal: %v; want no file", err)
	}
}
