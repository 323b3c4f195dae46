package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokenizer/tokenizertest"
)

func goldenTokenizer(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(p, tokenizertest.Tokenizer(t, "gpt4-style"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTokenizeCommandWritesIDs(t *testing.T) {
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	text := "package main\n\nfunc main() {\n\tprintln(\"héllo\")\n}\n"
	in := filepath.Join(dir, "in.txt")
	os.WriteFile(in, []byte(text), 0o644)
	tk, err := tokenizer.Load(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	want := tk.Encode(text)
	for _, dtype := range []string{"u16", "u32"} {
		out := filepath.Join(dir, "ids."+dtype)
		var log bytes.Buffer
		if err := runTokenize(context.Background(), &log, tokPath, in, out, dtype); err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(out)
		var got []uint32
		for i := 0; i < len(raw); {
			if dtype == "u16" {
				got = append(got, uint32(binary.LittleEndian.Uint16(raw[i:])))
				i += 2
			} else {
				got = append(got, binary.LittleEndian.Uint32(raw[i:]))
				i += 4
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d ids, want %d", dtype, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: id %d = %d, want %d", dtype, i, got[i], want[i])
			}
		}
	}
}

func TestTokenizeCommandBadInput(t *testing.T) {
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	in := filepath.Join(dir, "in.txt")
	os.WriteFile(in, []byte("hi"), 0o644)
	broken := filepath.Join(dir, "broken.json")
	os.WriteFile(broken, []byte(`{"model": {"type": "WordPiece"}}`), 0o644)
	big := filepath.Join(dir, "big.json")
	data, _ := os.ReadFile(tokPath)
	os.WriteFile(big, bytes.Replace(data, []byte(`"added_tokens": []`),
		[]byte(`"added_tokens": [{"id": 70000, "content": "<|endoftext|>", "special": true}]`), 1), 0o644)
	out := filepath.Join(dir, "out.ids")
	cases := []struct {
		tok, in, dtype, want string
	}{
		{tokPath, in, "u8", `--dtype "u8"`},
		{tokPath, filepath.Join(dir, "missing.txt"), "u16", "missing.txt"},
		{broken, in, "u16", "WordPiece"},
		{big, in, "u16", "70001 tokens, more than the 65536"},
		{"", in, "u16", "needs --tokenizer"},
	}
	for _, c := range cases {
		err := runTokenize(context.Background(), io.Discard, c.tok, c.in, out, c.dtype)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("tokenize %v: err = %v, want bad input mentioning %q", c, err, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("a failed tokenize left %s behind", out)
		}
	}
}

func TestTokenizerTrainCommand(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "corpus.txt")
	os.WriteFile(in, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\nfunc main() {}\n", 200)), 0o644)
	out := filepath.Join(dir, "tokenizer.json")
	if err := runTokenizerTrain(context.Background(), io.Discard, []string{in}, out, tokenizer.TrainOptions{VocabSize: 300}); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if tk.VocabSize() != 300 {
		t.Errorf("VocabSize = %d, want 300", tk.VocabSize())
	}
	err = runTokenizerTrain(context.Background(), io.Discard, []string{filepath.Join(dir, "nope.txt")}, out, tokenizer.TrainOptions{})
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "nope.txt") {
		t.Errorf("missing input: err = %v", err)
	}
	err = runTokenizerTrain(context.Background(), io.Discard, []string{in}, out, tokenizer.TrainOptions{VocabSize: 10})
	if err == nil || !isBadInput(err) {
		t.Errorf("vocab 10: err = %v, want bad input", err)
	}
}
