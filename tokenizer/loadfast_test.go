package tokenizer

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// parseBoth parses data with fastModel and with encoding/json alone.
func parseBoth(data []byte) (fast, slow *Tokenizer, fastErr, slowErr error) {
	fast, fastErr = Parse(data)
	fastLoad = false
	defer func() { fastLoad = true }()
	slow, slowErr = Parse(data)
	return
}

// sameTokenizer reports how a and b differ in what a load builds, or "".
func sameTokenizer(a, b *Tokenizer) string {
	a.decodeTables()
	b.decodeTables()
	switch {
	case a.VocabSize() != b.VocabSize():
		return "vocabulary size"
	case !slices.EqualFunc(a.tokens, b.tokens, bytes.Equal):
		return "token bytes"
	case !slices.Equal(a.tokenStr, b.tokenStr):
		return "token strings"
	case a.byteID != b.byteID:
		return "byte symbols"
	case !slices.Equal(a.merges.slots, b.merges.slots):
		return "merges"
	case len(a.vocab) != len(b.vocab) || len(a.byBytes) != len(b.byBytes):
		return "vocabulary"
	case a.unk != b.unk || a.ignoreMerges != b.ignoreMerges || len(a.added) != len(b.added):
		return "model options"
	case a.SHA256() != b.SHA256():
		return "SHA-256"
	}
	return ""
}

// The hand-read vocabulary and merges give the tokenizer encoding/json
// gives, and a file either path refuses the other refuses too: the golden
// files as they are, and thousands of edits of them that touch what the
// fast path reads (escapes, numbers, duplicate and differently cased keys,
// merges as pairs, stray bytes).
func TestFastLoadAgreesWithEncodingJSON(t *testing.T) {
	gpt2 := readTestdata(t, "gpt2-style.tokenizer.json")
	gpt4 := readTestdata(t, "gpt4-style.tokenizer.json")
	check := func(name string, data []byte) {
		t.Helper()
		fast, slow, fastErr, slowErr := parseBoth(data)
		if (fastErr == nil) != (slowErr == nil) {
			t.Fatalf("%s: fast path err %v, encoding/json err %v", name, fastErr, slowErr)
		}
		if fastErr != nil {
			if fastErr.Error() != slowErr.Error() {
				t.Fatalf("%s: fast path says %q, encoding/json %q", name, fastErr, slowErr)
			}
			return
		}
		if d := sameTokenizer(fast, slow); d != "" {
			t.Fatalf("%s: the fast path's %s differ", name, d)
		}
	}
	check("gpt2", gpt2)
	check("gpt4", gpt4)
	if _, _, _, _, ok := fastModel(gpt2, false); !ok {
		t.Fatal("the fast path refuses the golden gpt2-style file")
	}
	// Small vocabularies keep each parse quick.
	small := []byte(`{"added_tokens": [], "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
 "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "\"": 4, "a\"": 5, "\u0120a": 6, "\\": 7, "c": 8},
  "merges": ["a b", ["a", "\""], "\u0120 a"]}}`)
	check("small", small)
	edits := []string{"", " ", "\\", "\"", "\\u0041", "\\u00", "1", "-1", "1.5", "1e2", "01", "4294967296", "2147483648", ",", "}", "]", "{", "[",
		`"vocab": {}, `, `"merges": [], `, `"Vocab": {"a": 0}, `, `"model": {}, `, "\xff", "\x01", "null", "true", `["a", "b"]`, `"a b"`, `"a  b"`, `"ab"`}
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range 3000 {
		data := slices.Clone(small)
		for range 1 + rng.IntN(2) {
			at := rng.IntN(len(data) + 1)
			cut := min(len(data), at+rng.IntN(3))
			data = slices.Concat(data[:at], []byte(edits[rng.IntN(len(edits))]), data[cut:])
		}
		check(fmt.Sprintf("edit %d %q", i, data), data)
	}
}

func FuzzFastLoad(f *testing.F) {
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}`))
	f.Add([]byte(`{"model": {"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]], "type": "BPE"}, "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}, "added_tokens": [{"id": 3, "content": "<s>"}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, slow, fastErr, slowErr := parseBoth(data)
		if (fastErr == nil) != (slowErr == nil) {
			t.Fatalf("fast path err %v, encoding/json err %v", fastErr, slowErr)
		}
		if fastErr == nil {
			if d := sameTokenizer(fast, slow); d != "" {
				t.Fatalf("the fast path's %s differ", d)
			}
		} else if fastErr.Error() != slowErr.Error() {
			t.Fatalf("fast path says %q, encoding/json %q", fastErr, slowErr)
		}
	})
}

// SHA256 is the digest of the bytes parsed, even when it is first asked
// for after the caller has reused them.
func TestSHA256OfTheBytesParsed(t *testing.T) {
	data := slices.Clone(readTestdata(t, "gpt4-style.tokenizer.json"))
	want := fmt.Sprintf("%x", sha256.Sum256(data))
	tk, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	clear(data)
	if got := tk.SHA256(); got != want {
		t.Fatalf("SHA256 = %s, want %s", got, want)
	}
	// Nor do the tokens change: Parse keeps a copy of what it is given.
	if d := sameTokenizer(tk, loadStyle(t, "gpt4-style")); d != "" {
		t.Fatalf("the caller's bytes cleared after Parse: the tokenizer's %s changed", d)
	}
}

// Load parses the file's bytes in place, not a copy of them, and builds the
// tokenizer Parse builds from the same bytes, both styles.
func TestLoadBuildsWhatParseBuilds(t *testing.T) {
	for _, style := range styles {
		data := readTestdata(t, style+".tokenizer.json")
		path := filepath.Join(t.TempDir(), "tokenizer.json")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		loaded, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		if d := sameTokenizer(loaded, parsed); d != "" {
			t.Fatalf("%s: Load's %s differ from Parse's", style, d)
		}
		text := []byte("func main() {\n\tfmt.Println(\"héllo, wörld\")\n}\n")
		if got, want := loaded.EncodeBytes(text), parsed.EncodeBytes(text); !slices.Equal(got, want) {
			t.Fatalf("%s: Load encodes %v, Parse %v", style, got, want)
		}
	}
}

// The merges read beside the vocabulary are the model's: found in the
// golden file where its merges start, and set aside when the scan in order
// finds them elsewhere (a token named "merges", a "merges" key in another
// object before the model) or before the vocabulary.
func TestFastLoadFindsTheModelsMerges(t *testing.T) {
	gpt2 := readTestdata(t, "gpt2-style.tokenizer.json")
	key := []byte(`"merges": [`)
	if got, want := mergesArray(gpt2), bytes.Index(gpt2, key)+len(key)-1; got != want {
		t.Fatalf("the golden file's merges found at %d, want %d", got, want)
	}
	for name, data := range map[string][]byte{
		"a token named merges":  bytes.Replace(gpt2, []byte(`"vocab": {`), []byte(`"vocab": {"merges": 30093, `), 1),
		"merges in the decoder": bytes.Replace(gpt2, []byte(`"decoder": {`), []byte(`"decoder": {"merges": [["Ġ", "t"]], `), 1),
		"merges first": []byte(`{"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"},
 "model": {"type": "BPE", "merges": ["a b", "ab c"], "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}}}`),
	} {
		if _, _, _, _, ok := fastModel(data, false); !ok {
			t.Fatalf("%s: the fast path refuses it", name)
		}
		fast, slow, fastErr, slowErr := parseBoth(data)
		if fastErr != nil || slowErr != nil {
			t.Fatalf("%s: %v, %v", name, fastErr, slowErr)
		}
		if d := sameTokenizer(fast, slow); d != "" {
			t.Fatalf("%s: the fast path's %s differ", name, d)
		}
	}
}
