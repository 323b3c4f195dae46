package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// testdata holds the golden files: two tokenizer.json (the same vocabulary
// with the GPT-2 and the GPT-4 pre-tokenizer), texts, and the ids HF
// tokenizers 0.23.2 gives for each whole text, uint32 little-endian. Large
// files are gzipped.

var styles = []string{"gpt2-style", "gpt4-style"}
var texts = []string{"edge", "english", "go", "python"}

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	p := filepath.Join("testdata", name)
	if b, err := os.ReadFile(p); err == nil {
		return b
	}
	f, err := os.Open(p + ".gz")
	if err != nil {
		t.Fatalf("testdata %s: %v", name, err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("testdata %s: %v", name, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("testdata %s: %v", name, err)
	}
	return b
}

func loadStyle(t testing.TB, style string) *Tokenizer {
	t.Helper()
	tk, err := Parse(readTestdata(t, style+".tokenizer.json"))
	if err != nil {
		t.Fatalf("parse %s: %v", style, err)
	}
	return tk
}

func goldenIDs(t testing.TB, style, text string) []uint32 {
	raw := readTestdata(t, style+"."+text+".ids.u32")
	ids := make([]uint32, len(raw)/4)
	for i := range ids {
		ids[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	return ids
}

func TestGoldenIDs(t *testing.T) {
	for _, style := range styles {
		tk := loadStyle(t, style)
		for _, name := range texts {
			t.Run(style+"/"+name, func(t *testing.T) {
				text := readTestdata(t, name+".txt")
				want := goldenIDs(t, style, name)
				got := tk.EncodeBytes(text)
				if i := firstDiff(got, want); i >= 0 {
					lo := max(0, i-3)
					t.Fatalf("%d ids, want %d; first difference at %d: got %v want %v (tokens %q want %q)",
						len(got), len(want), i, got[lo:min(len(got), i+4)], want[lo:min(len(want), i+4)],
						tokStrs(tk, got[lo:min(len(got), i+4)]), tokStrs(tk, want[lo:min(len(want), i+4)]))
				}
				back, err := tk.Decode(got)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal([]byte(back), text) {
					t.Fatalf("decode(encode(text)) differs from text")
				}
			})
		}
	}
}

func tokStrs(tk *Tokenizer, ids []uint32) []string {
	var s []string
	for _, id := range ids {
		s = append(s, tk.Token(id))
	}
	return s
}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
