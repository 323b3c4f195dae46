package tokenizer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func trainInputs(t testing.TB) []io.Reader {
	var rs []io.Reader
	for _, name := range []string{"english", "go", "python", "edge"} {
		rs = append(rs, bytes.NewReader(readTestdata(t, name+".txt")))
	}
	return rs
}

func TestTrainWritesLoadableTokenizer(t *testing.T) {
	for _, pattern := range []string{"gpt4", "gpt2"} {
		t.Run(pattern, func(t *testing.T) {
			var stages []string
			data, err := Train(context.Background(), trainInputs(t), TrainOptions{
				VocabSize: 2000, Pattern: pattern,
				SpecialTokens: []string{"<|endoftext|>", "<|pad|>"},
				Progress: func(stage string, done, total int64) {
					if len(stages) == 0 || stages[len(stages)-1] != stage {
						stages = append(stages, stage)
					}
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(stages, ",") != "count,merge" {
				t.Errorf("progress stages %v", stages)
			}
			tk, err := Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			if tk.VocabSize() != 2000 {
				t.Errorf("VocabSize = %d, want 2000", tk.VocabSize())
			}
			if eos, ok := tk.EOS(); !ok || eos != 0 || !tk.IsSpecial(eos) {
				t.Errorf("EOS = %d, %v", eos, ok)
			}
			for b := 0; b < 256; b++ {
				if tk.byteID[b] == noID {
					t.Fatalf("byte %#x has no symbol", b)
				}
			}
			text := readTestdata(t, "go.txt")
			ids := tk.EncodeBytes(text)
			if back, _ := tk.Decode(ids); back != string(text) {
				t.Fatal("trained tokenizer does not round trip go.txt")
			}
			if ratio := float64(len(text)) / float64(len(ids)); ratio < 2 {
				t.Errorf("%.2f bytes per token on text it was trained on; merges are not applied", ratio)
			}
			again, err := Train(context.Background(), trainInputs(t), TrainOptions{VocabSize: 2000, Pattern: pattern, SpecialTokens: []string{"<|endoftext|>", "<|pad|>"}})
			if err != nil || !bytes.Equal(again, data) {
				t.Errorf("training twice gives different files (err %v)", err)
			}
		})
	}
}

func TestTrainMinFrequencyStopsEarly(t *testing.T) {
	data, err := Train(context.Background(), []io.Reader{strings.NewReader("abab abab cd")}, TrainOptions{VocabSize: 1000, MinFrequency: 2})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	// "ab" (4 times), "abab" (2), " abab"... pairs seen once are not merged.
	if _, ok := tk.TokenID("ab"); !ok {
		t.Error("frequent pair ab was not merged")
	}
	if _, ok := tk.TokenID("cd"); ok {
		t.Error("pair cd seen once was merged despite MinFrequency 2")
	}
	if tk.VocabSize() >= 1000 {
		t.Errorf("VocabSize %d: training did not stop early", tk.VocabSize())
	}
}

func TestTrainRejectsBadOptions(t *testing.T) {
	for _, o := range []TrainOptions{
		{VocabSize: 100},
		{MinFrequency: -1},
		{Pattern: "llama"},
		{SpecialTokens: []string{"<s>", "<s>"}},
	} {
		_, err := Train(context.Background(), nil, o)
		var bad interface{ BadInput() bool }
		if err == nil || !errors.As(err, &bad) {
			t.Errorf("options %+v: err = %v, want a bad-input error", o, err)
		}
	}
}

// A vocabulary with no special tokens trains and encodes: the added-token
// split finds nothing to split on.
func TestTrainWithoutSpecialTokens(t *testing.T) {
	data, err := Train(context.Background(), trainInputs(t), TrainOptions{VocabSize: 400, SpecialTokens: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tk.EOS(); ok || tk.VocabSize() != 400 {
		t.Errorf("vocabulary of %d with an EOS %v; want 400 and none", tk.VocabSize(), ok)
	}
	ids := tk.Encode("func main() {}")
	if text, err := tk.Decode(ids); len(ids) == 0 || err != nil || text != "func main() {}" {
		t.Errorf("encode and decode: %v -> %q, %v", ids, text, err)
	}
}

func TestTrainHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Train(ctx, trainInputs(t), TrainOptions{VocabSize: 1000}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// HF tokenizers must load the trained file and give the same ids as kiln.
func TestTrainedTokenizerMatchesHF(t *testing.T) {
	hfModuleDir(t)
	for _, pattern := range []string{"gpt4", "gpt2"} {
		data, err := Train(context.Background(), trainInputs(t), TrainOptions{VocabSize: 3000, Pattern: pattern})
		if err != nil {
			t.Fatal(err)
		}
		tk, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "trained.tokenizer.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var inputs []string
		for _, name := range texts {
			inputs = append(inputs, string(readTestdata(t, name+".txt")))
		}
		inputs = append(inputs, "a<|endoftext|>b", "x <|endoftext|>\n\ny")
		want := hfEncode(t, path, inputs)
		for i, s := range inputs {
			got := tk.Encode(s)
			if d := firstDiff(got, want[i]); d >= 0 {
				t.Fatalf("%s: input %d (%.30q...): ids differ from HF at %d", pattern, i, s, d)
			}
		}
	}
}

// The trainer learns exactly what it learned before it counted on all cores
// with per-worker tables: the same vocabulary, the same merges in the same
// order, byte for byte the file the earlier trainer wrote (its SHA-256)
// for the golden texts.
func TestTrainOutputUnchanged(t *testing.T) {
	for pattern, want := range map[string]string{
		"gpt4": "41b04f007c083f87ceaaa68f5456358872ebc8f8a8f33acf1b3408d5df2bbb92",
		"gpt2": "8228d5a6ed3c2bcac671603a49ef6c18c1f3e69bd8578b40b22a5d14c479ca84",
	} {
		data, err := Train(context.Background(), trainInputs(t), TrainOptions{VocabSize: 3000, Pattern: pattern})
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != want {
			t.Errorf("%s: trained file's SHA-256 %s, want %s", pattern, got, want)
		}
	}
}

// Shortfall suggests the size a training yielded only where a command
// takes it: a yield of no merge (257 ids) gets no size, where it said to
// ask for 257 ids, which sched tokenizer train refuses.
func TestShortfallNeverSuggestsASizeBelowTheLeast(t *testing.T) {
	for _, c := range []struct {
		got, asked int
		want, not  string
	}{
		{257, 300, "the corpus yields 257 ids of the 300 asked: no pair of symbols occurs twice or more, so it taught no merge; train on more text", "ask for"},
		{5275, 16384, "the corpus yields 5275 ids of the 16384 asked: no pair of symbols occurs twice or more; train on more text, or ask for 5275 ids", ""},
	} {
		msg := Shortfall(c.got, c.asked, 2)
		if !strings.Contains(msg, c.want) || c.not != "" && strings.Contains(msg, c.not) {
			t.Errorf("Shortfall(%d, %d): %q; want %q", c.got, c.asked, msg, c.want)
		}
	}
	if msg := Shortfall(300, 300, 2); msg != "" {
		t.Errorf("Shortfall of a full yield: %q; want none", msg)
	}
	// A training of no merge, which a command refuses, says why in the
	// same words, naming no size either.
	for minFrequency, want := range map[int64]string{0: "seen twice or more", 2: "seen twice or more", 5: "seen 5 times or more"} {
		if msg := NoMerge(minFrequency); !strings.Contains(msg, "the corpus has no pair of symbols "+want) || !strings.HasSuffix(msg, "train on more text") || strings.Contains(msg, "ask for") {
			t.Errorf("NoMerge(%d): %q; want it to say no pair is %s, and to train on more text", minFrequency, msg, want)
		}
	}
}
