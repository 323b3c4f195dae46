package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/schollz/progressbar/v3"

	"github.com/kiln-lm/kiln/internal/shell"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokenizer/tokenizertest"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
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
	// The same tokenizer published by name in the data directory's catalog.
	data := t.TempDir()
	os.MkdirAll(filepath.Join(data, "tokenizers", "g4"), 0o755)
	b, _ := os.ReadFile(tokPath)
	os.WriteFile(filepath.Join(data, "tokenizers", "g4", "tokenizer.json"), b, 0o644)
	env := []string{"KILN_DATA_DIR=" + data}
	for _, c := range []struct{ dtype, how string }{{"u16", "--tokenizer-file"}, {"u32", "--tokenizer-file"}, {"u16", "--tokenizer"}} {
		dtype := c.dtype
		out := filepath.Join(dir, "ids."+dtype+c.how)
		arg := tokPath
		if c.how == "--tokenizer" {
			arg = "g4"
		}
		_, errOut, code := sched(t, env, "tokenize", c.how, arg, "--in", in, "--out", out, "--dtype", dtype)
		if code != 0 {
			t.Fatalf("tokenize %s %s: exit %d: %s", c.how, arg, code, errOut)
		}
		// The closing line says what was written, from how much text, at
		// what rate.
		st, _ := os.Stat(in)
		if line := fmt.Sprintf("wrote %d ids (%s) to %s: %s of text in ", len(want), dtype, out, formatBytes(st.Size())); !strings.HasPrefix(errOut, line) || !strings.HasSuffix(errOut, "B/s\n") {
			t.Errorf("tokenize printed %q, want %q... B/s", errOut, line)
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

// A write that fails part-way (a full disk) ends the command with one
// line that names the text, the output and the system's reason, on one
// core (each piece written from its worker's scratch) and on several.
func TestTokenizeCommandWriteFailure(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full here")
	}
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, bytes.Repeat([]byte("func main() {\n\tprintln(1)\n}\n"), 1<<16), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, procs := range []string{"1", "4"} {
		_, errOut, code := sched(t, []string{"GOMAXPROCS=" + procs}, "tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", "/dev/full")
		want := "tokenize: " + in + " -> /dev/full: encode: write: write /dev/full: no space left on device"
		if code != 1 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("GOMAXPROCS %s: exit %d, %q; want exit 1 and one line %q", procs, code, errOut, want)
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
		args []string
		want string
	}{
		{[]string{"--tokenizer-file", tokPath, "--in", in, "--dtype", "u8"}, `--dtype "u8"`},
		// The width before the tokenizer: a mistyped --dtype is named
		// first, not a tokenizer that will not load.
		{[]string{"--tokenizer-file", broken, "--in", in, "--dtype", "u8"}, `--dtype "u8" is not u16 or u32: give u16 (vocabularies of up to 65536 ids) or u32`},
		{[]string{"--tokenizer-file", filepath.Join(dir, "none.json"), "--in", in, "--dtype", "U32"}, `--dtype "U32" is not u16 or u32`},
		{[]string{"--tokenizer-file", tokPath, "--in", filepath.Join(dir, "missing.txt")}, "missing.txt: no such file or directory (name a readable text file)"},
		{[]string{"--tokenizer-file", broken, "--in", in}, "WordPiece"},
		{[]string{"--tokenizer-file", big, "--in", in}, "70001 tokens, more than the 65536"},
		{[]string{"--in", in}, `tokenizer "mix-16384" is not known`},
		{[]string{"--tokenizer", tokPath, "--in", in}, "--tokenizer-file " + tokPath},
		{[]string{"--tokenizer", "g4", "--tokenizer-file", tokPath, "--in", in}, "not both"},
		{[]string{"--tokenizer-file", tokPath}, "needs --in and --out"},
		{[]string{"--tokenizer-file", tokPath, "--in", dir}, "--in " + dir + " is a directory; name one text file"},
	}
	for _, c := range cases {
		args := append([]string{"tokenize", "--out", out}, c.args...)
		_, errOut, code := sched(t, nil, args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line mentioning %q", args, code, errOut, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("a failed tokenize left %s behind", out)
		}
	}

	// An --out that cannot be written is refused before any work, by both
	// commands, and names what to do.
	// The command it suggests pastes into a shell, spaces and all.
	for _, nowhere := range []string{filepath.Join(dir, "no-such-dir", "out"), filepath.Join(dir, "no such dir", "out")} {
		for _, args := range [][]string{
			{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", nowhere},
			{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", nowhere},
		} {
			_, errOut, code := sched(t, nil, args...)
			want := "--out " + nowhere + ": its directory " + filepath.Dir(nowhere) + " does not exist; make it first (mkdir -p " + shell.Quote(filepath.Dir(nowhere)) + ")"
			if code != 2 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
				t.Errorf("%v: exit %d, %q; want exit 2 and one line %q", args, code, errOut, want)
			}
		}
	}
	// An --out that is a file the command reads (by its own path, or a
	// link to it) is refused before any work, and the file is left as it
	// was: the output would be renamed over it.
	link := filepath.Join(dir, "link.txt")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	tokCopy := filepath.Join(dir, "tok-copy.json")
	tokData, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokCopy, tokData, 0o644); err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tokenize", "--tokenizer-file", tokCopy, "--in", in, "--out", in}, "--out " + in + " is the file --in " + in + " names: the ids would replace it"},
		{[]string{"tokenize", "--tokenizer-file", tokCopy, "--in", in, "--out", link}, "--out " + link + " is the file --in " + in + " names"},
		{[]string{"tokenize", "--tokenizer-file", tokCopy, "--in", in, "--out", tokCopy}, "--out " + tokCopy + " is the file --tokenizer-file " + tokCopy + " names"},
		{[]string{"tokenizer", "train", "--in", out, "--in", in, "--vocab", "300", "--out", link}, "--out " + link + " is the file --in " + in + " names: the tokenizer would replace it"},
		// An empty name in the list, and a pattern of no such name, are
		// named as what was given: not "open : no such file", nor "train:".
		{[]string{"tokenizer", "train", "--in", in + ",," + in, "--vocab", "300", "--out", filepath.Join(t.TempDir(), "t.json")}, "tokenizer train: --in " + in + ",," + in + " names an empty file name (two commas, or one at an end)"},
		{[]string{"tokenizer", "train", "--in", in, "--pattern", "gpt3", "--vocab", "300", "--out", filepath.Join(t.TempDir(), "t.json")}, `--pattern "gpt3": give gpt4 (the GPT-4/Llama-3 split) or gpt2`},
	} {
		wantBadInput(t, nil, regexp.QuoteMeta(c.want), c.args...)
	}
	if got, err := os.ReadFile(in); err != nil || !bytes.Equal(got, text) {
		t.Errorf("the text --in names changed under a refused --out (%v)", err)
	}
	if got, err := os.ReadFile(tokCopy); err != nil || !bytes.Equal(got, tokData) {
		t.Errorf("the tokenizer --tokenizer-file names changed under a refused --out (%v)", err)
	}
	file := filepath.Join(in, "out")
	if _, errOut, code := sched(t, nil, "tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", file); code != 2 || !strings.Contains(errOut, in+" is not a directory") {
		t.Errorf("--out under a file: exit %d, %q", code, errOut)
	}
	if b, err := os.ReadFile(in); err != nil || string(b) != "hi" {
		t.Errorf("the input changed: %q %v", b, err)
	}
}

func TestTokenizerTrainCommand(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "corpus.txt")
	os.WriteFile(in, []byte(strings.Repeat("the quick brown fox jumps over the lazy dog\nfunc main() {}\n", 200)), 0o644)
	out := filepath.Join(dir, "tokenizer.json")
	if err := runTokenizerTrain(context.Background(), io.Discard, []string{in}, out, outPolicy{}, tokenizer.TrainOptions{VocabSize: 300}); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Load(out)
	if err != nil {
		t.Fatal(err)
	}
	if tk.VocabSize() != 300 {
		t.Errorf("VocabSize = %d, want 300", tk.VocabSize())
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("%s: %v, %v; want it readable by all (0644)", out, st.Mode(), err)
	}
	// A corpus with fewer merges in it than asked: the ids it yields,
	// and a warning that says so and what to do.
	var warn strings.Builder
	if err := runTokenizerTrain(context.Background(), &warn, []string{in}, out, outPolicy{force: true}, tokenizer.TrainOptions{VocabSize: 16384}); err != nil {
		t.Fatal(err)
	}
	if tk, err = tokenizer.Load(out); err != nil || tk.VocabSize() >= 16384 {
		t.Fatalf("VocabSize = %d (%v), want fewer than the 16384 asked", tk.VocabSize(), err)
	}
	if want := fmt.Sprintf("warning: the corpus yields %d ids of the 16384 asked", tk.VocabSize()); !strings.Contains(warn.String(), want) || !strings.Contains(warn.String(), "train on more text") {
		t.Errorf("output %q lacks %q", warn.String(), want)
	}
	err = runTokenizerTrain(context.Background(), io.Discard, []string{filepath.Join(dir, "nope.txt")}, out, outPolicy{force: true}, tokenizer.TrainOptions{})
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "nope.txt") || !strings.Contains(err.Error(), "name readable text files") {
		t.Errorf("missing input: err = %v", err)
	}
	err = runTokenizerTrain(context.Background(), io.Discard, []string{in}, out, outPolicy{force: true}, tokenizer.TrainOptions{VocabSize: 10})
	if err == nil || !isBadInput(err) {
		t.Errorf("vocab 10: err = %v, want bad input", err)
	}
	// Sizes the library reads as "default" and a directory are refused
	// at the command line, before any training, and the tokenizer already
	// at --out is left as it was.
	before, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	emptyText := filepath.Join(t.TempDir(), "empty.txt")
	if err := os.WriteFile(emptyText, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--in", in, "--vocab", "0"}, "--vocab 0: give a vocabulary of 258 to 16777216 ids (the 256 byte symbols, the special token <|endoftext|> and at least one merge"},
		// The bounds sched enqueue tokenizer holds a request to, in its words.
		{[]string{"--in", in, "--vocab", "100"}, "--vocab 100: give a vocabulary of 258 to 16777216 ids"},
		{[]string{"--in", in, "--vocab", "99999999999"}, "--vocab 99999999999: give a vocabulary of 258 to 16777216 ids"},
		{[]string{"--in", in, "--vocab", "258", "--special", "<|endoftext|>,<|pad|>"}, "--vocab 258: give a vocabulary of 259 to 16777216 ids (the 256 byte symbols, the 2 special tokens"},
		{[]string{"--in", in, "--min-frequency", "0"}, "--min-frequency 0: give how many times"},
		{[]string{"--in", in + "," + dir}, "--in " + dir + " is a directory; name its text files"},
		// No text at all would learn no merge: a tokenizer of the bytes
		// alone, below every vocabulary allowed.
		{[]string{"--in", emptyText}, "--in " + emptyText + " holds no text: name files of the text to learn the vocabulary from"},
	} {
		wantBadInput(t, nil, regexp.QuoteMeta(c.want), append([]string{"tokenizer", "train", "--out", out}, c.args...)...)
	}
	if after, err := os.ReadFile(out); err != nil || !bytes.Equal(after, before) {
		t.Errorf("a refused train changed %s (%v)", out, err)
	}
}

// A file and a pipe (which cannot be sized or seeked) give the ids of the
// whole text, cut into pieces on all cores; the empty file gives none.
func TestTokenizeFileAndPipeAgree(t *testing.T) {
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	tk, err := tokenizer.Load(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for i := 0; text.Len() < 3<<20; i++ {
		fmt.Fprintf(&text, "func f%d(x int) int {\n\treturn x * %d // héllo\n}\nThe %dth line of prose, isn't it?\n", i, i, i)
	}
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	want := appendU32(nil, tk.Encode(text.String()))
	fifo := filepath.Join(dir, "in.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			return
		}
		io.WriteString(f, text.String())
		f.Close()
	}()
	for _, src := range []string{in, fifo} {
		out := filepath.Join(dir, filepath.Base(src)+".ids")
		if _, errOut, code := sched(t, nil, "tokenize", "--tokenizer-file", tokPath, "--in", src, "--out", out, "--dtype", "u32"); code != 0 {
			t.Fatalf("tokenize %s: exit %d: %s", src, code, errOut)
		}
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, want) {
			t.Fatalf("tokenize %s: %d bytes of ids, want the whole text's %d", src, len(got), len(want))
		}
	}
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	out := filepath.Join(dir, "empty.ids")
	if _, errOut, code := sched(t, nil, "tokenize", "--tokenizer-file", tokPath, "--in", empty, "--out", out); code != 0 {
		t.Fatalf("tokenize an empty file: exit %d: %s", code, errOut)
	}
	if st, err := os.Stat(out); err != nil || st.Size() != 0 {
		t.Fatalf("an empty file's ids: %v, %v", st, err)
	}
}

func appendU32(dst []byte, ids []uint32) []byte {
	for _, id := range ids {
		dst = binary.LittleEndian.AppendUint32(dst, id)
	}
	return dst
}

// Ids and a trained tokenizer written to something that is not a regular
// file (a named pipe here; /dev/null likewise) go into it in place: the
// path is still that pipe afterwards, not a file renamed over it, and the
// reader gets every byte. A directory is refused as bad input.
func TestOutputThatIsNotAFileIsWrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	text := "package main\n\nfunc main() {}\n"
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Load(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "out.fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no named pipes here: %v", err)
	}
	for _, c := range []struct {
		name string
		args []string
		want func([]byte) error
	}{
		{"tokenize", []string{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", fifo, "--dtype", "u32"}, func(b []byte) error {
			if want := appendU32(nil, tk.Encode(text)); !bytes.Equal(b, want) {
				return fmt.Errorf("%d bytes of ids, want %d", len(b), len(want))
			}
			return nil
		}},
		{"tokenizer train", []string{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", fifo}, func(b []byte) error {
			if _, err := tokenizer.Parse(b); err != nil {
				return fmt.Errorf("what the pipe got is not a tokenizer: %v", err)
			}
			return nil
		}},
	} {
		got := make(chan []byte, 1)
		go func() {
			f, err := os.Open(fifo)
			if err != nil {
				got <- nil
				return
			}
			b, _ := io.ReadAll(f)
			f.Close()
			got <- b
		}()
		if _, errOut, code := sched(t, nil, c.args...); code != 0 {
			t.Fatalf("%s: exit %d: %s", c.name, code, errOut)
		}
		// Checked before the reader is waited for: a pipe renamed over has
		// no writer, and its reader would wait forever.
		if st, err := os.Lstat(fifo); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
			t.Fatalf("%s: %s is no longer a named pipe: %v, %v", c.name, fifo, st, err)
		}
		if err := c.want(<-got); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if _, errOut, code := sched(t, nil, "tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", dir); code != exitBadInput || !strings.Contains(errOut, dir) {
		t.Errorf("--out a directory: exit %d, %q; want exit %d naming it", code, errOut, exitBadInput)
	}
}

// The --in file behind the progress bar is still read by the encoder's
// workers at offsets, and gives the ids of the file itself, while the bar
// counts every byte of it.
func TestTokenizeProgressFileReadsAtOffsets(t *testing.T) {
	dir := t.TempDir()
	tk, err := tokenizer.Load(goldenTokenizer(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for i := 0; text.Len() < 3<<20; i++ {
		fmt.Fprintf(&text, "func f%d(x int) int {\n\treturn x * %d\n}\nThe %dth line, isn't it?\n", i, i, i)
	}
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte(text.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var _ interface {
		io.ReaderAt
		io.Seeker
	} = progressFile{}
	bar := progressbar.NewOptions64(int64(text.Len()), progressbar.OptionSetWriter(io.Discard))
	var out bytes.Buffer
	if _, err := tk.EncodeReaderTo(context.Background(), progressFile{f, bar}, &out, 4); err != nil {
		t.Fatal(err)
	}
	if want := appendU32(nil, tk.Encode(text.String())); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("%d bytes of ids, want the file's %d", out.Len(), len(want))
	}
	if n := bar.State().CurrentBytes; n < float64(text.Len()) {
		t.Errorf("the bar counted %.0f bytes of %d", n, text.Len())
	}
}

// sched tokenizer train with no end-of-text token among --special is
// refused naming the flag, and writes nothing.
func TestTokenizerTrainNeedsAnEndOfTextToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "corpus.txt"), filepath.Join(dir, "tokenizer.json")
	os.WriteFile(in, []byte(strings.Repeat("the quick brown fox\n", 100)), 0o644)
	// None at all, or none that ends a document: no ingest could use it.
	for _, special := range []string{"", "<pad>,<unk>"} {
		_, errOut, code := sched(t, nil, "tokenizer", "train", "--in", in, "--vocab", "300", "--out", out, "--special", special)
		if code != 2 || !strings.Contains(errOut, "--special") || !strings.Contains(errOut, "end-of-text") || strings.Count(errOut, "\n") != 1 {
			t.Errorf("--special %q: exit %d, %q", special, code, errOut)
		}
		if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a refused training wrote %s: %v", out, err)
		}
	}
	if _, errOut, code := sched(t, nil, "tokenizer", "train", "--in", in, "--vocab", "300", "--out", out, "--special", "<pad>,</s>"); code != 0 {
		t.Errorf("--special <pad>,</s>: exit %d, %s", code, errOut)
	}
}

// A file already at --out is replaced only with --force, by both commands:
// refused, it is left as it was; forced, it holds the new output, readable
// by all.
func TestOutputIsReplacedOnlyWithForce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	text := "package main\n\nfunc main() {}\n"
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte(strings.Repeat(text, 50)), 0o644); err != nil {
		t.Fatal(err)
	}
	old := []byte("an older file, someone's\n")
	for _, c := range []struct {
		name string
		args []string
		want func([]byte) error
	}{
		{"tokenize", []string{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--dtype", "u32"}, func(b []byte) error {
			if len(b) == 0 || len(b)%4 != 0 {
				return fmt.Errorf("%d bytes, not u32 ids", len(b))
			}
			return nil
		}},
		{"tokenizer train", []string{"tokenizer", "train", "--in", in, "--vocab", "300"}, func(b []byte) error {
			_, err := tokenizer.Parse(b)
			return err
		}},
	} {
		out := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".out")
		if err := os.WriteFile(out, old, 0o600); err != nil {
			t.Fatal(err)
		}
		args := append(c.args, "--out", out)
		wantBadInput(t, nil, regexp.QuoteMeta("--out "+out+" already exists: pass --force to replace it, or choose another path"), args...)
		if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, old) {
			t.Fatalf("%s: a refused --out changed: %q, %v", c.name, b, err)
		}
		if _, errOut, code := sched(t, nil, append(args, "--force")...); code != 0 {
			t.Fatalf("%s --force: exit %d: %s", c.name, code, errOut)
		}
		b, err := os.ReadFile(out)
		if err == nil {
			err = c.want(b)
		}
		if err != nil {
			t.Errorf("%s --force: %s holds no new output: %v", c.name, out, err)
		}
		if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o644 {
			t.Errorf("%s --force: %s is %v (%v); want it readable by all", c.name, out, st.Mode(), err)
		}
		if left, _ := filepath.Glob(out + ".tmp*"); len(left) > 0 {
			t.Errorf("%s --force left %v behind", c.name, left)
		}
	}
}

// The files kiln manages are never an --out, --force or not, by their path
// or a link to them: a token store's files (and a new file in its
// directory), and a published tokenizer's, local copy or the local object
// store's, or a new local copy of one object storage holds. Each refusal
// names what the file is and who uses it; everything is left as it was and
// the catalog still lists the tokenizer.
func TestOutputNeverReplacesAFileKilnManages(t *testing.T) {
	t.Parallel()
	home := t.TempDir()
	data := filepath.Join(home, "data")
	env := []string{"KILN_DATA_DIR=" + data}
	ctx := context.Background()
	objects, err := store.NewLocal(filepath.Join(data, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	tj := trainSmall(t, "func main() { println(1) }\npackage main\n")
	if _, err := catalog.New(objects, data).Publish(ctx, "go-4096", tj); err != nil {
		t.Fatal(err)
	}
	other := trainSmall(t, "alpha beta gamma delta")
	objects.Put(ctx, catalog.Key("remote-only"), bytes.NewReader(other), int64(len(other)))
	objects.Put(ctx, "checkpoints/pilot/step-0000100/tokenizer.json", bytes.NewReader(tj), int64(len(tj)))
	storeDir := filepath.Join(data, "tokens", "code")
	writeStore(t, storeDir, tj)

	in := filepath.Join(home, "in.txt")
	os.WriteFile(in, []byte(strings.Repeat("func main() {}\n", 100)), 0o644)
	tokPath := filepath.Join(home, "tokenizer.json")
	os.WriteFile(tokPath, tj, 0o644)
	linkDir := filepath.Join(home, "store-link")
	if err := os.Symlink(storeDir, linkDir); err != nil {
		t.Fatal(err)
	}
	hard := filepath.Join(home, "ids.bin")
	if err := os.Link(filepath.Join(storeDir, tokens.TokensFile), hard); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(data, "tokenizers", "remote-only"), 0o755)
	published := filepath.Join(data, "tokenizers", "go-4096", "tokenizer.json")
	storeFile := "--out %s is token store " + storeDir + "'s file"
	users := "that token store code and run pilot use: a published name always means the same bytes, so it is refused even with --force; write to another path"
	before := snapshot(t, data)
	for _, c := range []struct{ out, want string }{
		{published, "--out " + published + " is the published tokenizer go-4096 " + users},
		{filepath.Join(data, "objects", "tokenizers", "go-4096", "tokenizer.json"), "is the published tokenizer go-4096 " + users},
		{filepath.Join(data, "tokenizers", "remote-only", "tokenizer.json"), "is the published tokenizer remote-only (no token store or run uses it yet)"},
		{filepath.Join(storeDir, tokens.TokensFile), fmt.Sprintf(storeFile, filepath.Join(storeDir, tokens.TokensFile)) + ": replacing it would break the store, so it is refused even with --force; write to another path"},
		{filepath.Join(storeDir, tokens.ManifestFile), fmt.Sprintf(storeFile, filepath.Join(storeDir, tokens.ManifestFile))},
		{filepath.Join(linkDir, tokens.ManifestFile), "is token store " + linkDir + "'s file"},
		{hard, fmt.Sprintf(storeFile, hard) + " (a link to it)"},
		{filepath.Join(storeDir, "new.ids"), "--out " + filepath.Join(storeDir, "new.ids") + " is inside token store " + storeDir},
	} {
		for _, args := range [][]string{
			{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", c.out, "--force"},
			{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", c.out, "--force"},
		} {
			wantBadInput(t, env, regexp.QuoteMeta(c.want), args...)
		}
	}
	// A command configured with another data directory (another shell's
	// KILN_DATA_DIR, or none) knows nothing of this one's catalog, and
	// still may not replace what it holds.
	elsewhere := []string{"KILN_DATA_DIR=" + filepath.Join(home, "elsewhere")}
	for _, out := range []string{published, filepath.Join(data, "objects", "tokenizers", "go-4096", "tokenizer.json")} {
		for _, args := range [][]string{
			{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", out, "--force"},
			{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", out, "--force"},
		} {
			wantBadInput(t, elsewhere, regexp.QuoteMeta("--out "+out+" is the tokenizer go-4096 of the data directory "+data+" (its catalog's copy): a published name always means the same bytes, so it is refused even with --force"), args...)
		}
	}
	if after := snapshot(t, data); !maps.Equal(after, before) {
		t.Errorf("refused outputs changed the data directory:\nbefore %v\nafter  %v", before, after)
	}
	if out, errOut, code := sched(t, env, "tokenizers", "go-4096"); code != 0 || !strings.Contains(out, "# Tokenizer go-4096") {
		t.Errorf("sched tokenizers go-4096 after the refusals: exit %d\n%s%s", code, out, errOut)
	}
}

// snapshot is every file under dir with its contents.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		files[p] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A tokenizer file that is not one is refused in one line naming it: a
// device read only to the cap (it used to run out of memory), a
// vocabulary that gives one id to two tokens, and one that lacks a byte's
// symbol, which encoding dropped from the text.
func TestTokenizeRefusesABadTokenizerFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	os.WriteFile(in, []byte("hi"), 0o644)
	shared := filepath.Join(dir, "shared.json")
	data := tokenizertest.Tokenizer(t, "gpt4-style")
	var f map[string]any
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	vocab := f["model"].(map[string]any)["vocab"].(map[string]any)
	tok5 := ""
	for k, v := range vocab {
		if v.(float64) == 5 {
			tok5 = k
		}
	}
	vocab["zzzz-extra"] = 5
	first, second := tok5, "zzzz-extra" // named in sorted order
	if second < first {
		first, second = second, first
	}
	b, _ := json.Marshal(f)
	os.WriteFile(shared, b, 0o644)
	// A vocabulary without the symbol of byte 0x65 ("e"), and no unknown
	// token: every e was dropped from the ids without a word.
	noE := filepath.Join(dir, "no-e.json")
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	model := f["model"].(map[string]any)
	for k := range model["vocab"].(map[string]any) {
		if strings.Contains(k, "e") {
			delete(model["vocab"].(map[string]any), k)
		}
	}
	var merges []any
	for _, m := range model["merges"].([]any) {
		if !strings.Contains(fmt.Sprint(m), "e") {
			merges = append(merges, m)
		}
	}
	model["merges"] = merges
	b, _ = json.Marshal(f)
	os.WriteFile(noE, b, 0o644)
	out := filepath.Join(dir, "out.ids")
	for _, c := range []struct{ file, want string }{
		{"/dev/zero", "--tokenizer-file /dev/zero: is larger than 256 MiB, the most a tokenizer.json may be"},
		{shared, fmt.Sprintf("--tokenizer-file %s: model.vocab gives id 5 to two tokens, %q and %q", shared, first, second)},
		{noE, fmt.Sprintf("--tokenizer-file %s: its vocabulary lacks the byte-level symbols of 1 of the 256 bytes (the first: byte 0x65, symbol \"e\") and it has no unk_token, so text holding them would be dropped from its encodings", noE)},
	} {
		if _, err := os.Stat(c.file); err != nil {
			continue
		}
		wantBadInput(t, nil, regexp.QuoteMeta(c.want), "tokenize", "--tokenizer-file", c.file, "--in", in, "--out", out)
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("a refused tokenizer left %s behind", out)
		}
	}
}

// A training checkpoint's files are never an --out, --force or not, by
// their path or a path through a link to the checkpoint: replaced (or one
// added), the checkpoint no longer matches its trainer_state.json and a
// resume sets it aside. Each refusal names the checkpoint; the run is left
// as it was and resumes from its newest checkpoint.
func TestOutputNeverWritesIntoACheckpoint(t *testing.T) {
	t.Parallel()
	run, args := trainedRun(t)
	home := t.TempDir()
	in := filepath.Join(home, "in.txt")
	os.WriteFile(in, []byte(strings.Repeat("func main() {}\n", 100)), 0o644)
	tokPath := goldenTokenizer(t, home)
	step := filepath.Join(run, "step-0000002")
	link := filepath.Join(home, "latest")
	if err := os.Symlink(step, link); err != nil {
		t.Fatal(err)
	}
	file := "is checkpoint %s's file: replacing it would damage the checkpoint, so it is refused even with --force; write to another path"
	before := dirDigest(t, run)
	for _, c := range []struct{ out, want string }{
		{filepath.Join(step, trainer.ModelFile), "--out " + filepath.Join(step, trainer.ModelFile) + " " + fmt.Sprintf(file, step)},
		{filepath.Join(step, trainer.TokenizerFile), "--out " + filepath.Join(step, trainer.TokenizerFile) + " " + fmt.Sprintf(file, step)},
		{filepath.Join(step, trainer.StateFile), fmt.Sprintf(file, step)},
		{filepath.Join(link, trainer.ConfigFile), "--out " + filepath.Join(link, trainer.ConfigFile) + " " + fmt.Sprintf(file, link)},
		{filepath.Join(step, "ids.bin"), "--out " + filepath.Join(step, "ids.bin") + " is inside checkpoint " + step + ", whose files only training writes; write to another path (--force does not change this)"},
	} {
		for _, args := range [][]string{
			{"tokenize", "--tokenizer-file", tokPath, "--in", in, "--dtype", "u32", "--out", c.out, "--force"},
			{"tokenizer", "train", "--in", in, "--vocab", "300", "--out", c.out, "--force"},
		} {
			wantBadInput(t, nil, regexp.QuoteMeta(c.want), args...)
		}
	}
	if after := dirDigest(t, run); after != before {
		t.Errorf("refused outputs changed the run:\nbefore %s\nafter  %s", before, after)
	}
	_, errOut, code := sched(t, nil, append(args, "--steps", "3", "--resume")...)
	if set, _ := filepath.Glob(filepath.Join(run, "*.damaged*")); code != 0 || len(set) > 0 || strings.Contains(errOut, "damaged") {
		t.Errorf("resume after the refusals: exit %d, set aside %v\n%s", code, set, errOut)
	}
	if _, err := os.Stat(filepath.Join(run, "step-0000003", trainer.StateFile)); err != nil {
		t.Errorf("the resumed run wrote no step 3: %v", err)
	}
}

// An empty --out names no file: refused by both commands before any work,
// where tokenizer train used to learn the whole vocabulary and then fail
// to rename its output onto "".
func TestOutputMustNameAFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tokPath := goldenTokenizer(t, dir)
	in := filepath.Join(dir, "in.txt")
	os.WriteFile(in, []byte(strings.Repeat("the quick brown fox\n", 100)), 0o644)
	wantBadInput(t, nil, "--out", "tokenize", "--tokenizer-file", tokPath, "--in", in, "--out", "")
	wantBadInput(t, nil, regexp.QuoteMeta(`--out "" names no file; give the file to write`), "tokenizer", "train", "--in", in, "--vocab", "300", "--out", "", "--force")
	if left, _ := filepath.Glob(".tmp*"); len(left) > 0 {
		t.Errorf("a refused --out left %v behind", left)
	}
}
