package tokenizer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

func TestEncodeReaderMatchesWholeText(t *testing.T) {
	old := streamChunk
	streamChunk = 4096
	defer func() { streamChunk = old }()
	for _, style := range styles {
		tk := loadStyle(t, style)
		for _, name := range []string{"edge", "go", "python"} {
			text := readTestdata(t, name+".txt")
			want := goldenIDs(t, style, name)
			var got []uint32
			calls := 0
			err := tk.EncodeReader(context.Background(), iotest.HalfReader(bytes.NewReader(text)), func(ids []uint32) error {
				calls++
				got = append(got, ids...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("%s/%s: streamed ids differ at %d of %d", style, name, i, len(want))
			}
			if len(text) > 3*4096 && calls < 3 {
				t.Errorf("%s/%s: %d chunks for %d bytes; the text was not cut", style, name, calls, len(text))
			}
		}
	}
}

func TestEncodeReaderStopsOnEmitError(t *testing.T) {
	tk := loadStyle(t, "gpt2-style")
	boom := errors.New("disk full")
	err := tk.EncodeReader(context.Background(), strings.NewReader("hello\nworld"), func([]uint32) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want %v", err, boom)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = tk.EncodeReader(ctx, strings.NewReader("hello\nworld"), func([]uint32) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}
}

// Invalid UTF-8 is encoded byte by byte where it is invalid and decodes to
// the same bytes.
func TestInvalidUTF8RoundTrip(t *testing.T) {
	inputs := [][]byte{
		{0xff}, {0xc3}, []byte("caf\xc3"), []byte("a\x80b c\xed\xa0\x80d"), []byte("\xf0\x9f\x98 ok"),
		{0xfe, 0xfe, ' ', 'x', 0xc0, 0xaf}, []byte("it\xff's"),
	}
	for _, style := range styles {
		tk := loadStyle(t, style)
		for _, in := range inputs {
			ids := tk.EncodeBytes(in)
			out, err := tk.Decode(ids)
			if err != nil {
				t.Fatal(err)
			}
			if out != string(in) {
				t.Errorf("%s: %q -> %v -> %q", style, in, ids, out)
			}
			if s := tk.Encode(string(in)); firstDiff(s, ids) >= 0 {
				t.Errorf("%s: Encode and EncodeBytes differ on %q", style, in)
			}
		}
		// An invalid byte is a symbol of its own class: it splits words
		// like punctuation does.
		ids := tk.EncodeBytes([]byte("hello\xffworld"))
		if got := tokStrs(tk, ids); got[0] != "hello" || got[len(got)-1] != "world" {
			t.Errorf("%s: hello\\xffworld -> %q", style, got)
		}
	}
}

// The heap merge for long words and the scan for short ones must agree
// exactly; words of 2 to longWord bytes, of letters, of what code has
// (runs of one character, spaces, punctuation, digits) and of anything,
// exercise both, one scratch space serving every word as in an encoder.
func TestLongWordMergeAgrees(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	alphabets := []string{"etaoinshrdlu_", "  \t\n-=*/(){}:;.,0123456789xyz", "\x00\x80\xff\xc3\xa9e"}
	for _, style := range styles {
		tk := loadStyle(t, style)
		var scratch mergeScratch
		for trial := 0; trial < 3000; trial++ {
			n := 2 + r.IntN(longWord-1)
			alphabet := alphabets[trial%len(alphabets)]
			w := make([]byte, n)
			for i := range w {
				w[i] = alphabet[r.IntN(len(alphabet))]
				if trial%7 == 0 && i > 0 {
					w[i] = w[i-1] // runs of one character
				}
			}
			syms := make([]uint32, n)
			for i, c := range w {
				syms[i] = tk.byteID[c]
			}
			a := tk.merges.mergeWith(append([]uint32(nil), syms...), &scratch)
			b := tk.merges.mergeHeap(append([]uint32(nil), syms...))
			if firstDiff(a, b) >= 0 {
				t.Fatalf("%s, word %q: scan %v heap %v", style, w, a, b)
			}
		}
	}
}

// A long text without whitespace is one word; it must encode in
// O(n log n), and round trip.
func TestHugeWordRoundTrip(t *testing.T) {
	tk := loadStyle(t, "gpt4-style")
	var b strings.Builder
	r := rand.New(rand.NewPCG(5, 6))
	for b.Len() < 1<<20 {
		b.WriteString([]string{"abc", "def", "ghij", "x", "yz", "ing", "tion"}[r.IntN(7)])
	}
	ids := tk.Encode(b.String())
	out, _ := tk.Decode(ids)
	if out != b.String() {
		t.Fatal("huge word does not round trip")
	}
	if len(ids) > b.Len()/2 {
		t.Errorf("%d ids for %d bytes: merges did not apply", len(ids), b.Len())
	}
}

func TestEncodeBatchMatchesEncode(t *testing.T) {
	tk := loadStyle(t, "gpt4-style")
	text := string(readTestdata(t, "python.txt"))
	var docs []string
	for len(text) > 0 {
		n := min(len(text), 3000)
		docs = append(docs, text[:n])
		text = text[n:]
	}
	got := tk.EncodeBatch(docs)
	// Documents share blocks of ids: appending to one must not write into
	// the next.
	for i := range got {
		_ = append(got[i], 1<<30, 1<<30)
	}
	for i, d := range docs {
		if firstDiff(got[i], tk.Encode(d)) >= 0 {
			t.Fatalf("doc %d differs", i)
		}
	}
}

func TestVocabularyHelpers(t *testing.T) {
	tk := loadStyle(t, "gpt2-style")
	if tk.VocabSize() != 30093 {
		t.Errorf("VocabSize = %d, want 30093", tk.VocabSize())
	}
	if len(tk.SHA256()) != 64 {
		t.Errorf("SHA256 = %q", tk.SHA256())
	}
	id, ok := tk.TokenID("Ġthe")
	if !ok || tk.Token(id) != "Ġthe" {
		t.Errorf("TokenID(Ġthe) = %d, %v", id, ok)
	}
	if _, ok := tk.EOS(); ok {
		t.Errorf("the golden vocabulary has no end-of-text token, EOS found one")
	}
	if _, err := tk.Decode([]uint32{1 << 30}); err == nil || !strings.Contains(err.Error(), "1073741824") {
		t.Errorf("decode of an unknown id: %v", err)
	}
}

// withAdded returns the golden gpt2-style file with added tokens.
func withAdded(t *testing.T, added string) []byte {
	raw := readTestdata(t, "gpt2-style.tokenizer.json")
	out := bytes.Replace(raw, []byte(`"added_tokens": []`), []byte(`"added_tokens": `+added), 1)
	if bytes.Equal(out, raw) {
		t.Fatal("golden file has no empty added_tokens to replace")
	}
	return out
}

func TestAddedTokensMatchedBeforePreTokenization(t *testing.T) {
	tk, err := Parse(withAdded(t, `[{"id":30093,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
		{"id":30094,"content":"<|end|>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true}]`))
	if err != nil {
		t.Fatal(err)
	}
	eos, ok := tk.EOS()
	if !ok || eos != 30093 || !tk.IsSpecial(eos) || tk.VocabSize() != 30095 {
		t.Fatalf("EOS = %d %v, vocab %d", eos, ok, tk.VocabSize())
	}
	plain := loadStyle(t, "gpt2-style")
	got := tk.Encode("a b<|endoftext|>c d  <|end|>  e")
	want := append(plain.Encode("a b"), 30093)
	want = append(append(want, plain.Encode("c d")...), 30094)
	want = append(want, plain.Encode("e")...)
	if firstDiff(got, want) >= 0 {
		t.Fatalf("got %q want %q", tokStrs(tk, got), tokStrs(tk, want))
	}
	s, _ := tk.Decode(tk.Encode("x<|endoftext|>y"))
	if s != "x<|endoftext|>y" {
		t.Errorf("decode = %q", s)
	}
}

// A tokenizer path that leads nowhere is bad input, named with its path.
func TestLoadMissingFileIsBadInput(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "none.json"))
	var b interface{ BadInput() bool }
	if err == nil || !errors.As(err, &b) || !b.BadInput() || !strings.Contains(err.Error(), "none.json") {
		t.Fatalf("Load of a missing file: %v; want a bad-input error naming the file", err)
	}
}

// With ignore_merges a word that is a token comes out as that token, and
// other words as the merges make them: every token that is one word of the
// GPT-2 split, and the golden English text, which must still round trip.
func TestIgnoreMergesEmitsWholeTokens(t *testing.T) {
	raw := readTestdata(t, "gpt2-style.tokenizer.json")
	data := bytes.Replace(raw, []byte(`"ignore_merges": false`), []byte(`"ignore_merges": true`), 1)
	if bytes.Equal(data, raw) {
		t.Fatal("golden file has no ignore_merges to set")
	}
	tk, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	tk.decodeTables()
	for id, b := range tk.tokens {
		if len(b) == 0 || len(splitGPT2(b, 0, nil)) != 1 {
			continue
		}
		if got := tk.EncodeBytes(b); len(got) != 1 || got[0] != uint32(id) {
			t.Fatalf("token %d (%q): encoded as %v", id, b, got)
		}
		checked++
	}
	if checked < 1000 {
		t.Fatalf("only %d tokens checked", checked)
	}
	text := readTestdata(t, "english.txt")
	if back, _ := tk.Decode(tk.EncodeBytes(text)); back != string(text) {
		t.Fatal("english.txt does not round trip")
	}
	// A word the merges do not make into its token: "b c" ranks first, so
	// the merges give a, bc; the token abc is emitted whole only when
	// merges are ignored.
	small := `{"model": {"type": "BPE", "ignore_merges": %v, "vocab": {"a": 0, "b": 1, "c": 2, "bc": 3, "ab": 4, "abc": 5},
		"merges": ["b c", "a b"]}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}`
	for _, c := range []struct {
		ignore bool
		want   []uint32
	}{{false, []uint32{0, 3}}, {true, []uint32{5}}} {
		tk, err := Parse([]byte(fmt.Sprintf(small, c.ignore)))
		if err != nil {
			t.Fatal(err)
		}
		if got := tk.Encode("abc"); !slices.Equal(got, c.want) {
			t.Errorf("ignore_merges %v: abc -> %v, want %v", c.ignore, got, c.want)
		}
	}
}
