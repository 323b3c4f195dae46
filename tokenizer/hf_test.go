package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// These tests hold kiln to HF tokenizers itself: they run the npm package
// `tokenizers` (0.23.2, Rust inside) through node when both are installed.
// Set KILN_HF_TOKENIZERS_DIR to the folder holding node_modules/tokenizers
// (for example after `npm install tokenizers@0.23.2` there).

const hfScript = `
const t = require('tokenizers'); const fs = require('fs');
const [tokfile, textsFile] = process.argv.slice(2);
(async () => {
  const tk = t.Tokenizer.fromFile(tokfile);
  const texts = JSON.parse(fs.readFileSync(textsFile, 'utf8'));
  const out = [];
  for (const s of texts) out.push(Array.from((await tk.encode(s)).getIds()));
  process.stdout.write(JSON.stringify(out));
})().catch(e => { console.error(String(e)); process.exit(1); });
`

// hfModuleDir returns a folder from which node resolves `tokenizers`, or
// skips the test saying why.
func hfModuleDir(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("skipping comparison with HF tokenizers: node is not installed")
	}
	var dirs []string
	if d := os.Getenv("KILN_HF_TOKENIZERS_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	wd, _ := os.Getwd()
	dirs = append(dirs, wd, filepath.Join(os.TempDir(), "hf"))
	for _, d := range dirs {
		cmd := exec.Command(node, "-e", "require.resolve('tokenizers')")
		cmd.Dir = d
		if cmd.Run() == nil {
			return d
		}
	}
	t.Skipf("skipping comparison with HF tokenizers: node cannot find the npm package tokenizers from %v; run `npm install tokenizers@0.23.2` in a folder and set KILN_HF_TOKENIZERS_DIR to it", dirs)
	return ""
}

// hfEncodeStyle is hfEncode with the test data's tokenizer of style.
func hfEncodeStyle(t *testing.T, style string, texts []string) [][]uint32 {
	t.Helper()
	path := filepath.Join(t.TempDir(), style+".tokenizer.json")
	if err := os.WriteFile(path, readTestdata(t, style+".tokenizer.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	return hfEncode(t, path, texts)
}

// hfEncode encodes texts with HF tokenizers through node.
func hfEncode(t *testing.T, tokPath string, texts []string) [][]uint32 {
	t.Helper()
	dir := hfModuleDir(t)
	tmp := t.TempDir()
	script := filepath.Join(dir, ".kiln-hf-encode.js")
	if err := os.WriteFile(script, []byte(hfScript), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(script)
	in, _ := json.Marshal(texts)
	textsFile := filepath.Join(tmp, "texts.json")
	if err := os.WriteFile(textsFile, in, 0o644); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(tokPath)
	cmd := exec.Command("node", script, abs, textsFile)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("HF tokenizers through node: %v: %s", err, stderr.String())
	}
	var ids [][]uint32
	if err := json.Unmarshal(out, &ids); err != nil {
		t.Fatalf("HF tokenizers output: %v", err)
	}
	return ids
}

// nastyAlphabet mixes the characters where the regexes' classes and
// lookaheads matter: every kind of whitespace, apostrophes and contraction
// letters (with the long s that folds to s), digits of several scripts,
// combining marks, letters of several scripts, emoji and punctuation.
var nastyAlphabet = []string{
	" ", " ", " ", "\t", "\n", "\r", "\r\n", "\v", "\f", "\u00a0", "\u0085", "\u2003", "\u3000", "\u200b", "\u2028", "\u1680", "\u202f",
	"'", "'", "s", "S", "t", "T", "re", "RE", "ve", "ll", "LL", "m", "d", "D", "ſ", "K", "\u212a",
	"a", "b", "x", "é", "e\u0301", "ß", "Ω", "я", "日本", "한", "ا", "ע", "ǅ", "ʰ",
	"0", "1", "7", "42", "123", "٣", "²", "½", "Ⅻ", "𝟘",
	".", ",", "!", "?", "_", "-", "(", ")", "{", "}", "<", ">", "|", "\"", "#", "$", "€", "😀", "👍🏽", "\u200d", "©",
}

func randomNasty(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(nastyAlphabet[r.IntN(len(nastyAlphabet))])
	}
	return b.String()
}

func TestMatchesHFOnRandomText(t *testing.T) {
	hfModuleDir(t)
	r := rand.New(rand.NewPCG(1, 2))
	var texts []string
	for i := 0; i < 400; i++ {
		texts = append(texts, randomNasty(r, 1+r.IntN(60)))
	}
	for _, style := range styles {
		tk := loadStyle(t, style)
		want := hfEncodeStyle(t, style, texts)
		bad := 0
		for i, s := range texts {
			got := tk.Encode(s)
			if firstDiff(got, want[i]) >= 0 {
				bad++
				if bad <= 5 {
					t.Errorf("%s: text %q: got %q want %q", style, s, tokStrs(tk, got), tokStrs(tk, want[i]))
				}
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d texts differ from HF", style, bad, len(texts))
		}
	}
}

// Long words, merged by mergeHeap (more than longWord bytes), get HF's
// ids: runs of one character, letters, code's characters and digits of up
// to about 20,000 bytes (longWordsToMerge's, those that are valid UTF-8,
// which is all HF takes).
func TestLongWordsMatchHF(t *testing.T) {
	hfModuleDir(t)
	var texts []string
	for _, w := range longWordsToMerge(rand.New(rand.NewPCG(1, 2))) {
		if utf8.Valid(w) {
			texts = append(texts, string(w))
		}
	}
	for _, style := range styles {
		tk := loadStyle(t, style)
		want := hfEncodeStyle(t, style, texts)
		long := 0
		for i, s := range texts {
			if j := firstDiff(tk.Encode(s), want[i]); j >= 0 {
				t.Fatalf("%s: text %d of %d bytes (%q...): ids differ from HF's at %d", style, i, len(s), s[:20], j)
			}
			if _, n := longestWord([]byte(s), wordEnd(style)); n > longWord {
				long++
			}
		}
		if long < len(texts)/3 {
			t.Errorf("%s: %d of %d texts have a word of more than %d bytes, want a third", style, long, len(texts), longWord)
		}
	}
}

func TestAddedTokensMatchHF(t *testing.T) {
	hfModuleDir(t)
	data := withAdded(t, `[{"id":30093,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
		{"id":30094,"content":"<|end|>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true},
		{"id":30095,"content":"<|end","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}]`)
	tk, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "added.tokenizer.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 8))
	pieces := []string{"<|endoftext|>", "<|end|>", "<|end", "<|", " ", "  ", "\n", "a", "b c", "'s", "1"}
	var texts []string
	for range 300 {
		var b strings.Builder
		for range 1 + r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		texts = append(texts, b.String())
	}
	want := hfEncode(t, path, texts)
	for i, s := range texts {
		if got := tk.Encode(s); firstDiff(got, want[i]) >= 0 {
			t.Fatalf("text %q: got %q want %q", s, tokStrs(tk, got), tokStrs(tk, want[i]))
		}
	}
}
