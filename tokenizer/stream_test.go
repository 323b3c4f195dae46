package tokenizer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// streamIDs encodes text through EncodeReader with pieces of about chunk
// bytes, read a few bytes at a time.
func streamIDs(t testing.TB, tk *Tokenizer, text []byte, chunk int) (ids []uint32, calls int) {
	t.Helper()
	old := streamChunk
	streamChunk = chunk
	defer func() { streamChunk = old }()
	err := tk.EncodeReader(context.Background(), iotest.HalfReader(bytes.NewReader(text)), func(b []uint32) error {
		calls++
		ids = append(ids, b...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids, calls
}

// piecesMatchWhole encodes text in pieces of about streamBytes read as a
// stream, then of about fileBytes read at offsets as a file is, and says
// how either differs from the ids of the whole text, or "".
func piecesMatchWhole(t testing.TB, tk *Tokenizer, text []byte, streamBytes, fileBytes int) string {
	t.Helper()
	want := tk.EncodeBytes(text)
	if got, _ := streamIDs(t, tk, text, streamBytes); firstDiff(got, want) >= 0 {
		return fmt.Sprintf("from a stream in pieces of %d: ids differ at %d", streamBytes, firstDiff(got, want))
	}
	old := streamChunk
	streamChunk = fileBytes
	defer func() { streamChunk = old }()
	var out bytes.Buffer
	n, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), &out, 4)
	if err != nil || n != int64(len(want)) || !bytes.Equal(out.Bytes(), appendLE(nil, want, 4)) {
		return fmt.Sprintf("from a file in pieces of %d: %d ids, %v; want %d, the same bytes", fileBytes, n, err, len(want))
	}
	return ""
}

// randomText mixes what the safe cut looks at (line breaks before letters,
// after visible characters and after spaces) with everything the
// pre-tokenizers treat specially: contractions, digits, runs of spaces and
// line breaks, multi-byte letters and numbers, and invalid UTF-8.
func randomText(rng *rand.Rand, n int) []byte {
	parts := []string{"\n", "\n", "\r\n", "\n\n", " ", "  ", "\t", "a", "Zeta", "func", "x", "'s", "'LL", "'re", "'", "7", "123456",
		"(", ")", "{}", ";", ".", "é", "日本", "٣", "\u00a0", "\u2028", "\xff", "\xc3", "ſ", "\u0301", "<|end|>", "ok\nGo", "}\nfunc",
		"ok\r\nGo", "}\r\nfunc", "\r", "\r\n\r\n"}
	var b []byte
	for len(b) < n {
		b = append(b, parts[rng.IntN(len(parts))]...)
	}
	return b
}

// The ids of a text cut into pieces at safe points and encoded on all
// cores are the ids of the whole text: on the golden texts (their HF ids),
// and on random text of every kind the pre-tokenizers distinguish, for both
// styles, with pieces small enough that every text is cut many times.
func TestEncodeReaderCutsEqualWholeText(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, style := range styles {
		tk := loadStyle(t, style)
		for _, name := range texts {
			text := readTestdata(t, name+".txt")
			for _, chunk := range []int{64, 1000, 1 << 16} {
				got, calls := streamIDs(t, tk, text, chunk)
				if i := firstDiff(got, goldenIDs(t, style, name)); i >= 0 {
					t.Fatalf("%s/%s, pieces of %d bytes: ids differ from HF's at %d", style, name, chunk, i)
				}
				if len(text) > 4*chunk && calls < 3 {
					t.Errorf("%s/%s: %d pieces of %d bytes for %d bytes: the text was not cut", style, name, calls, chunk, len(text))
				}
			}
		}
		for trial := range 300 {
			text := randomText(rng, 1+rng.IntN(4000))
			n := 16 + rng.IntN(200)
			if d := piecesMatchWhole(t, tk, text, n, n); d != "" {
				t.Fatalf("%s, trial %d, %s, for %q", style, trial, d, text)
			}
		}
	}
}

// EncodeReaderTo's workers, encoding each piece through their own scratch,
// write the ids of the whole text, on random text of every kind cut into
// many pieces, both styles.
func TestEncodeReaderToPiecesEqualWholeText(t *testing.T) {
	oldChunk := streamChunk
	defer func() { streamChunk = oldChunk }()
	rng := rand.New(rand.NewPCG(13, 14))
	for _, style := range styles {
		tk := loadStyle(t, style)
		for trial := range 300 {
			text := randomText(rng, 1+rng.IntN(8000))
			streamChunk = 16 + rng.IntN(2000)
			var out bytes.Buffer
			n, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), &out, 4)
			want := tk.EncodeBytes(text)
			if err != nil || n != int64(len(want)) || !bytes.Equal(out.Bytes(), appendLE(nil, want, 4)) {
				t.Fatalf("%s, trial %d, pieces of %d: %d ids, %v; want %d, the same bytes, for %q",
					style, trial, streamChunk, n, err, len(want), text)
			}
		}
	}
}

func FuzzEncodeReaderCuts(f *testing.F) {
	f.Add([]byte("a\nb\nc"), uint8(1))
	f.Add([]byte("x.\nfoo 's\n\nbar\r\nBaz  \nq"), uint8(3))
	f.Add([]byte("x.\r\nfoo\r\n\r\nbar}\r\nBaz \r\nq"), uint8(2))
	f.Add([]byte("日本。\n\u3000x\n  Привет\n\u00a0\n\t\xe3\x80\n\xff\nq"), uint8(2))
	// The golden vocabularies, and trained ones that merge "\r\n",
	// indentation and blank lines, so that a cut parting them changes the
	// ids, with an added token that strips whitespace and without.
	tks := []*Tokenizer{loadStyle(f, "gpt2-style"), loadStyle(f, "gpt4-style"), cutTokenizer(f, "gpt2", ""), cutTokenizer(f, "gpt4", ""),
		cutTokenizer(f, "gpt2", "rstrip"), cutTokenizer(f, "gpt4", "lstrip")}
	f.Fuzz(func(t *testing.T, text []byte, chunk uint8) {
		for _, tk := range tks {
			if d := piecesMatchWhole(t, tk, text, 1+int(chunk), 1+int(chunk)); d != "" {
				t.Fatalf("%s, for %q", d, text)
			}
		}
	})
}

// Tokenizers whose ids a cut could change are encoded whole: one that adds
// a prefix space, one whose pre-tokenizer does not split (the text is one
// word), and one with an added token that strips the line break on its
// left and starts with a letter.
func TestEncodeReaderDoesNotCutWhereACutChangesIDs(t *testing.T) {
	noSplit := bytes.Replace(readTestdata(t, "gpt2-style.tokenizer.json"), []byte(`"use_regex": true`), []byte(`"use_regex": false`), 1)
	prefix := bytes.Replace(readTestdata(t, "gpt2-style.tokenizer.json"), []byte(`"add_prefix_space": false`), []byte(`"add_prefix_space": true`), 1)
	for name, data := range map[string][]byte{
		"no split":     noSplit,
		"prefix space": prefix,
		"lstrip token": withAdded(t, `[{"id":30093,"content":"Zed","single_word":false,"lstrip":true,"rstrip":false,"normalized":false,"special":true}]`),
	} {
		tk, err := Parse(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if tk.cuttable() {
			t.Errorf("%s: cuttable", name)
		}
		text := []byte("one.\nZed two;\nZed three\nfour\n")
		text = bytes.Repeat(text, 20)
		got, calls := streamIDs(t, tk, text, 32)
		if i := firstDiff(got, tk.EncodeBytes(text)); i >= 0 || calls != 1 {
			t.Errorf("%s: %d pieces; ids differ from the whole text's at %d", name, calls, i)
		}
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("disk full")
	}
	w.after--
	return len(p), nil
}

// EncodeReaderTo writes what EncodeReader emits, as little-endian
// integers of either width, and says when it cannot write.
func TestEncodeReaderToWritesIDs(t *testing.T) {
	old := streamChunk
	streamChunk = 1 << 12
	defer func() { streamChunk = old }()
	tk := loadStyle(t, "gpt4-style")
	text := readTestdata(t, "python.txt")
	want := goldenIDs(t, "gpt4-style", "python")
	for _, width := range []int{2, 4} {
		var out bytes.Buffer
		n, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), &out, width)
		if err != nil || n != int64(len(want)) {
			t.Fatalf("width %d: %d ids, %v; want %d", width, n, err, len(want))
		}
		if !bytes.Equal(out.Bytes(), appendLE(nil, want, width)) {
			t.Fatalf("width %d: the bytes are not the golden ids", width)
		}
	}
	for _, width := range []int{2, 4} {
		var out bytes.Buffer
		if _, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), &out, width); err != nil {
			t.Fatal(err)
		}
		for i, id := range want[:100] {
			var got uint32
			if width == 2 {
				got = uint32(binary.LittleEndian.Uint16(out.Bytes()[2*i:]))
			} else {
				got = binary.LittleEndian.Uint32(out.Bytes()[4*i:])
			}
			if got != id {
				t.Fatalf("width %d: id %d is %d, want %d", width, i, got, id)
			}
		}
	}
	if _, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), io.Discard, 3); err == nil {
		t.Error("width 3 accepted")
	}
	// A write that fails, the first or a later one, from a worker whose
	// piece's turn had come or one that found it waiting, ends the stream
	// with its error.
	for _, procs := range []int{1, 4} {
		old := runtime.GOMAXPROCS(procs)
		for after := range 4 {
			_, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), &failingWriter{after: after}, 2)
			if err == nil || !strings.Contains(err.Error(), "disk full") {
				t.Errorf("%d workers, a writer failing after %d writes: err = %v", procs, after, err)
			}
		}
		runtime.GOMAXPROCS(old)
	}
}

// bufferWriter records which buffers the bytes it is given live in.
type bufferWriter struct {
	bytes.Buffer
	buffers map[*byte]bool
}

func (w *bufferWriter) Write(p []byte) (int, error) {
	w.buffers[unsafe.SliceData(p)] = true
	return w.Buffer.Write(p)
}

// A piece whose turn has come when it is encoded is written from the
// worker's own scratch, not copied into a buffer of the piece: on one
// worker every piece is, so the writes of a text of many pieces all come
// from one buffer. On several workers the ids are the same.
func TestEncodeReaderToWritesAPieceInTurnFromTheScratch(t *testing.T) {
	oldChunk := streamChunk
	streamChunk = 1 << 12
	defer func() { streamChunk = oldChunk }()
	tk := loadStyle(t, "gpt4-style")
	text := readTestdata(t, "python.txt")
	want := goldenIDs(t, "gpt4-style", "python")
	for _, procs := range []int{1, 4} {
		old := runtime.GOMAXPROCS(procs)
		for _, width := range []int{2, 4} {
			w := &bufferWriter{buffers: map[*byte]bool{}}
			n, err := tk.EncodeReaderTo(context.Background(), bytes.NewReader(text), w, width)
			if err != nil || n != int64(len(want)) || !bytes.Equal(w.Bytes(), appendLE(nil, want, width)) {
				t.Fatalf("%d workers, width %d: %d ids, %v; want the %d golden ids", procs, width, n, err, len(want))
			}
			if pieces := len(text) / streamChunk; procs == 1 && (pieces < 8 || len(w.buffers) != 1) {
				t.Errorf("one worker, width %d: %d pieces written from %d buffers; want one buffer", width, pieces, len(w.buffers))
			}
		}
		runtime.GOMAXPROCS(old)
	}
}

// cutRules are the three rules a tokenizer may cut by.
var cutRules = []cutRule{{ok: true, kind: cutLF}, {ok: true, kind: cutBefore}, {ok: true, kind: cutAfter}}

// cutParts is what the cut rules look at, and what they pass over:
// line breaks, letters, digits, spaces and tabs, other scripts' letters and
// punctuation, whitespace of several bytes, bytes that are not UTF-8 (a
// character's first bytes alone among them), and ASCII control characters,
// whitespace and not.
var cutParts = []string{"\n", "\n", "\n", "\r", "\r", "\n", "a", "b", "1", " ", ";", "\t", "\t", "  ",
	"é", "日", "。", "\u3000", "\u00a0", "\u2028", "\xe3\x80", "\xff", "\xc3", "\x01", "\x7f", "\v"}

// cutPartsText is n of cutParts at random.
func cutPartsText(rng *rand.Rand, n int) []byte {
	var b []byte
	for range n {
		b = append(b, cutParts[rng.IntN(len(cutParts))]...)
	}
	return b
}

// last(b, from) finds last(b, 0)'s cut whenever b's first from bytes hold
// none, so that the stream searches each byte once: on random text of line
// breaks, letters, digits and spaces, every prefix length, every rule.
func TestCutRuleLastFindsTheLastCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, r := range cutRules {
		for trial := range 2000 {
			b := cutPartsText(rng, 1+rng.IntN(150))
			for from := 0; from <= len(b); from++ {
				if r.last(b[:from], 0) > 0 {
					continue // the precondition: the searched bytes held no cut
				}
				if got, want := r.last(b, from), r.last(b, 0); got != want {
					t.Fatalf("%+v, trial %d, %q from %d: %d, want %d", r, trial, b, from, got, want)
				}
			}
			want := -1
			for p := len(b) - 1; p >= 0; p-- {
				if isCut(r, b, p) {
					want = p
					break
				}
			}
			if got := r.last(b, 0); got != want {
				t.Fatalf("%+v, trial %d, %q: last %d, want %d", r, trial, b, got, want)
			}
		}
	}
}

// numericLines is text with a line break every few bytes and no cut by
// any rule: no line starts with a letter or within 15 blanks of a
// character, and none ends in one.
func numericLines(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%16s%d,%d \n", "", i, i*7)
	}
	return b.Bytes()
}

// A long stretch without a cut, read a piece at a time, still gives the
// whole text's ids.
func TestEncodeReaderUncuttableStretch(t *testing.T) {
	for _, style := range styles {
		tk := loadStyle(t, style)
		stretch := numericLines(300_000)
		if r := tk.cutRule(); r.last(stretch, 0) >= 0 {
			t.Fatalf("%s: the stretch has a cut by %+v", style, r)
		}
		text := append(stretch, "The end of it.\n"...)
		got, _ := streamIDs(t, tk, text, 1000)
		if i := firstDiff(got, tk.EncodeBytes(text)); i >= 0 {
			t.Fatalf("%s: ids differ at %d", style, i)
		}
	}
}

// pipeReader hands out at most 64 KiB a read, as a pipe does.
type pipeReader struct{ r io.Reader }

func (p pipeReader) Read(b []byte) (int, error) { return p.r.Read(b[:min(len(b), 64<<10)]) }

// BenchmarkEncodeReaderUncuttable streams 16 MB of short numeric lines,
// which hold no cut, through EncodeReader with its default pieces, read
// 64 KiB at a time as from a pipe.
func BenchmarkEncodeReaderUncuttable(b *testing.B) {
	tk := loadStyle(b, "gpt2-style")
	text := numericLines(16 << 20)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		if err := tk.EncodeReader(context.Background(), pipeReader{bytes.NewReader(text)}, func([]uint32) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// isCut is a cut rule at one offset, written out.
func isCut(r cutRule, b []byte, p int) bool {
	if p < 1 || p >= len(b) {
		return false
	}
	visible := func(i int) bool { return i >= 0 && b[i] > ' ' && b[i] < 0x7f }
	// notSpace: the character decoded as c, of w bytes, is not
	// whitespace (a byte that is not UTF-8 never is).
	notSpace := func(c rune, w int) bool {
		return c == utf8.RuneError && w == 1 || !unicode.IsSpace(c)
	}
	switch r.kind {
	case cutBefore:
		lf := bytes.HasPrefix(b[p:], []byte("\n")) || bytes.HasPrefix(b[p:], []byte("\r\n"))
		return lf && notSpace(utf8.DecodeLastRune(b[:p]))
	case cutAfter:
		blanks := len(indentThenAny.Find(b[p:]))
		q := p + blanks
		return b[p-1] == '\n' && q < len(b) && blanks <= 15 && (b[q] < utf8.RuneSelf || utf8.FullRune(b[q:])) && notSpace(utf8.DecodeRune(b[q:]))
	}
	return b[p-1] == '\n' && visible(p-2) && b[p]|0x20 >= 'a' && b[p]|0x20 <= 'z'
}

// indentThenAny is the spaces and tabs after a cutAfter cut.
var indentThenAny = regexp.MustCompile(`^[ \t]*`)

// cutAfter reads at most cutReach bytes from the cut: up to 15 spaces or
// tabs and the visible character after them; a deeper indentation is not
// cut, at the end of a buffer nothing is cut that needs bytes past it, and
// the stream still gives the whole text's ids.
func TestCutAfterReachesFifteenBlanks(t *testing.T) {
	r := cutRule{ok: true, kind: cutAfter}
	for n, want := range map[int]int{0: 2, 1: 2, 15: 2, 16: -1, 40: -1} {
		b := []byte("x\n" + strings.Repeat("\t ", n)[:n] + "y")
		if got := r.first(b, 0, len(b)); got != want {
			t.Errorf("%d blanks: first cut %d, want %d", n, got, want)
		}
		if got := r.first(b[:len(b)-1], 0, len(b)); got != -1 {
			t.Errorf("%d blanks, the visible character cut off: cut at %d", n, got)
		}
	}
	tk := loadStyle(t, "gpt4-style")
	text := []byte(strings.Repeat("f(x)\n"+strings.Repeat(" ", 20)+"return y\n\tz\n", 300))
	if got, calls := streamIDs(t, tk, text, 64); calls < 10 || firstDiff(got, tk.EncodeBytes(text)) >= 0 {
		t.Errorf("deep indentation: %d pieces, or the ids differ", calls)
	}
}

// first(b, from, to) finds the first offset in [from, to) where the rule
// allows a cut, reading past to where the rule needs to: on random text of
// line breaks, letters, digits and spaces, from every offset, every rule.
func TestCutRuleFirstIsTheFirstSafeCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, r := range cutRules {
		for trial := range 2000 {
			b := cutPartsText(rng, rng.IntN(150))
			for from := 0; from <= len(b); from++ {
				to := from + rng.IntN(len(b)-from+1)
				want, wantTo := -1, -1
				for p := from; p < len(b); p++ {
					if isCut(r, b, p) {
						want = p
						break
					}
				}
				if want >= 0 && want < to {
					wantTo = want
				}
				if got := r.first(b, from, len(b)); got != want {
					t.Fatalf("%+v, trial %d, %q from %d: %d, want %d", r, trial, b, from, got, want)
				}
				if got := r.first(b, from, to); got != wantTo {
					t.Fatalf("%+v, trial %d, %q from %d to %d: %d, want %d", r, trial, b, from, to, got, wantTo)
				}
			}
		}
	}
}

// A text read at offsets is cut into pieces that together are the text,
// each starting at a safe cut (or where the text starts), when the workers
// read their pieces at once: random texts, pieces of 16 bytes and up,
// one to sixteen workers, the text starting anywhere in its reader.
// A worker reads each piece into its last piece's buffer: the buffer made
// for the first piece holds every later one, which starts a few bytes
// before its nominal start, where a cut's rule looks (it grew again for the
// second piece, a quarter more, on every worker).
func TestFilePiecesReuseTheFirstPiecesBuffer(t *testing.T) {
	old := streamChunk
	streamChunk = 1 << 12
	defer func() { streamChunk = old }()
	text := bytes.Repeat([]byte("x := f(y)\n"), 10*streamChunk/10)
	for _, rule := range cutRules {
		fp, ok := newFilePieces(bytes.NewReader(text), rule, 1)
		if !ok {
			t.Fatal("a bytes.Reader is not read at offsets")
		}
		var j streamJob
		var first *byte
		var got []byte
		for n := 0; ; n++ {
			ok, err := fp.next(&j)
			if err != nil || !ok {
				if err != nil {
					t.Fatal(err)
				}
				break
			}
			got = append(got, j.text...)
			if n == 0 {
				first = unsafe.SliceData(j.buf)
			} else if unsafe.SliceData(j.buf) != first {
				t.Fatalf("rule %v: piece %d (%d bytes) read into a new buffer of %d bytes", rule, n, len(j.text), cap(j.buf))
			}
			j.buf, j.text = j.buf[:0], nil
		}
		if !bytes.Equal(got, text) {
			t.Fatalf("rule %v: the pieces are not the text", rule)
		}
	}
}

func TestFilePiecesCoverTheTextAtSafeCuts(t *testing.T) {
	old := streamChunk
	defer func() { streamChunk = old }()
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 300 {
		text := randomText(rng, rng.IntN(6000))
		if trial%3 == 0 {
			text = append(numericLines(rng.IntN(3000)), text...)
		}
		skip := rng.IntN(50)
		r := bytes.NewReader(append(bytes.Repeat([]byte{'#'}, skip), text...))
		if _, err := r.Seek(int64(skip), io.SeekStart); err != nil {
			t.Fatal(err)
		}
		streamChunk = 16 + rng.IntN(500)
		rule := cutRules[trial%len(cutRules)]
		fp, ok := newFilePieces(r, rule, 1+rng.IntN(16))
		if !ok {
			t.Fatal("a bytes.Reader is not read at offsets")
		}
		var mu sync.Mutex
		pieces := map[int][]byte{}
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					var j streamJob
					ok, err := fp.next(&j)
					if err != nil {
						t.Error(err)
						return
					}
					if !ok {
						return
					}
					mu.Lock()
					pieces[j.seq] = bytes.Clone(j.text)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if err := fp.finish(); err != nil {
			t.Fatal(err)
		}
		var got []byte
		nonEmpty := 0
		for seq := range len(pieces) {
			p, ok := pieces[seq]
			if !ok {
				t.Fatalf("trial %d: piece %d of %d missing", trial, seq, len(pieces))
			}
			if len(p) > 0 {
				if len(got) > 0 && !isCut(rule, text, len(got)) {
					t.Fatalf("trial %d: piece %d starts at %d, not a safe cut, in %q", trial, seq, len(got), text)
				}
				nonEmpty++
			}
			got = append(got, p...)
		}
		if !bytes.Equal(got, text) {
			t.Fatalf("trial %d, pieces of %d: the pieces are not the text:\n%q\nwant\n%q", trial, streamChunk, got, text)
		}
		if at, _ := r.Seek(0, io.SeekCurrent); at != int64(skip+len(text)) {
			t.Errorf("trial %d: the reader is left at %d, want the end, %d", trial, at, skip+len(text))
		}
		if rule.last(text, 0) > 0 && len(text) > 4*streamChunk && nonEmpty < 2 {
			t.Errorf("trial %d: %d bytes with a safe cut in one piece of %d", trial, len(text), streamChunk)
		}
	}
}

// A file is read by the workers at offsets, and gives the ids of its whole
// text from where it was left, through EncodeReader and EncodeReaderTo, on
// one to eight workers: the golden texts (their HF ids) and random text
// with stretches that hold no cut.
func TestEncodeReaderFromAFileMatchesWholeText(t *testing.T) {
	oldChunk, oldProcs := streamChunk, runtime.GOMAXPROCS(0)
	defer func() { streamChunk = oldChunk; runtime.GOMAXPROCS(oldProcs) }()
	rng := rand.New(rand.NewPCG(9, 10))
	path := filepath.Join(t.TempDir(), "text")
	check := func(tk *Tokenizer, text []byte, want []uint32, what string) {
		t.Helper()
		head := []byte("# not part of it\n")
		if err := os.WriteFile(path, append(head, text...), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, to := range []bool{false, true} {
			if _, err := f.Seek(int64(len(head)), io.SeekStart); err != nil {
				t.Fatal(err)
			}
			var got []uint32
			if to {
				var out bytes.Buffer
				n, err := tk.EncodeReaderTo(context.Background(), f, &out, 4)
				if err != nil || n != int64(out.Len()/4) {
					t.Fatalf("%s: %d ids, %v", what, n, err)
				}
				for i := 0; i < out.Len(); i += 4 {
					got = append(got, binary.LittleEndian.Uint32(out.Bytes()[i:]))
				}
			} else if err := tk.EncodeReader(context.Background(), f, func(ids []uint32) error {
				got = append(got, ids...)
				return nil
			}); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if i := firstDiff(got, want); i >= 0 {
				t.Fatalf("%s (EncodeReaderTo %v): ids differ at %d of %d", what, to, i, len(want))
			}
			if at, _ := f.Seek(0, io.SeekCurrent); at != int64(len(head)+len(text)) {
				t.Errorf("%s: the file is left at %d, want its end, %d", what, at, len(head)+len(text))
			}
		}
	}
	for _, style := range styles {
		tk := loadStyle(t, style)
		for _, procs := range []int{1, 2, 3, 8} {
			runtime.GOMAXPROCS(procs)
			for _, name := range texts {
				streamChunk = 1 << (8 + rng.IntN(8))
				check(tk, readTestdata(t, name+".txt"), goldenIDs(t, style, name), fmt.Sprintf("%s/%s, %d workers, pieces of %d", style, name, procs, streamChunk))
			}
			for trial := range 40 {
				text := randomText(rng, rng.IntN(5000))
				if trial%4 == 0 {
					text = append(append(text, numericLines(2000)...), randomText(rng, 500)...)
				}
				streamChunk = 16 + rng.IntN(400)
				check(tk, text, tk.EncodeBytes(text), fmt.Sprintf("%s, %d workers, trial %d, pieces of %d: %q", style, procs, trial, streamChunk, text))
			}
		}
	}
}

// appendLE writes every id, of any count and at any offset in dst, as
// the standard library's conversion does, in both widths; ids of 16 bits
// or more keep their low 16 bits in width 2.
func TestAppendLEMatchesTheStandardConversion(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := range 40 {
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = rng.Uint32() >> rng.IntN(32)
		}
		for _, width := range []int{2, 4} {
			prefix := []byte("abc")[:rng.IntN(4)]
			want := append([]byte(nil), prefix...)
			for _, id := range ids {
				if width == 2 {
					want = binary.LittleEndian.AppendUint16(want, uint16(id))
				} else {
					want = binary.LittleEndian.AppendUint32(want, id)
				}
			}
			if got := appendLE(append([]byte(nil), prefix...), ids, width); !bytes.Equal(got, want) {
				t.Fatalf("%d ids, width %d: %x, want %x", n, width, got, want)
			}
			if got := leInPlace(slices.Clone(ids), width); !bytes.Equal(got, want[len(prefix):]) {
				t.Fatalf("%d ids, width %d, in place: %x, want %x", n, width, got, want[len(prefix):])
			}
		}
	}
}

// cutText is random text of what decides where a cut may go: line ends in
// visible characters, spaces and line breaks ("\n" and "\r\n"), lines
// indented by tabs and spaces, lines of whitespace alone, letters, digits,
// punctuation, non-ASCII, and the added token "<t>".
func cutText(rng *rand.Rand, n int) []byte {
	parts := []string{"\r\n", "\n", "\n", "\n\t", "\n\t\t", "\n\t\t\t", "\n    ", "\n        ", "\r\n\t", "\n\t\n", "\n \n",
		"\t", " ", "  ", "x", ".", "}", "{", "func", "a", "Go", "'s", "1", "23", ";", "(", "é", "\u00a0", "<t>",
		"日本", "。", "Привет", "\u3000", "\u2028", "\n\u3000", "\u00a0\n", "\xe3\x80", "\xff"}
	var b []byte
	for len(b) < n {
		b = append(b, parts[rng.IntN(len(parts))]...)
	}
	return b
}

// cutTokenizer is a tokenizer of the pattern trained on cutText, with the
// added token "<t>" stripping whitespace as strip says ("", "lstrip" or
// "rstrip"): its vocabulary merges "\r\n", indentation and blank lines
// ("\n\t", "\n\t\n"), where the golden ones hold no such merges and would
// give the same ids whether a cut parts them or not.
func cutTokenizer(t testing.TB, pattern, strip string) *Tokenizer {
	t.Helper()
	rng := rand.New(rand.NewPCG(21, 22))
	corpus := cutText(rng, 200_000)
	raw, err := Train(context.Background(), []io.Reader{bytes.NewReader(corpus)}, TrainOptions{VocabSize: 600, Pattern: pattern, SpecialTokens: []string{"<t>"}})
	if err != nil {
		t.Fatal(err)
	}
	if strip != "" {
		raw = bytes.Replace(raw, []byte(`"`+strip+`":false`), []byte(`"`+strip+`":true`), 1)
	}
	tk, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// Each tokenizer cuts where its pattern allows (cutBefore for GPT-2's,
// cutAfter for GPT-4's, cutLF where an added token strips whitespace),
// and keeps the ids of the whole text, read from a stream and from a file,
// with vocabularies that merge what a cut elsewhere would part: each case
// below is a cut in a wrong place that changes the ids, beside the rule's
// own cut, which does not. Code indented by tabs and "\r\n" lines are cut
// into many pieces (a generated function of megabytes was one).
func TestCutsKeepTheIDs(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 24))
	type cut struct {
		text         string
		wrong, right int // offsets: a cut that changes the ids, and the rule's
	}
	for _, c := range []struct {
		pattern, strip string
		kind           cutKind
		cuts           []cut
	}{
		{"gpt2", "", cutBefore, []cut{
			{"x\n\t\tfoo", 2, 1},   // after "\n": "\n\t" is the whole text's word
			{"x\r\nabc", 3, 1},     // after "\r\n": the whole text has "\r", "\n"
			{"x.\n\n\tabc", 3, 2}}, // between line breaks
		},
		{"gpt4", "", cutAfter, []cut{
			{"x\n\t\n\tfoo", 2, 4}, // after a "\n" that a blank line's run takes on
			{"x\r\nabc", 2, 3}},    // between "\r" and "\n"
		},
		{"gpt2", "rstrip", cutLF, []cut{
			{"x<t>\n\nabc.\nabc", 4, 11}}, // before "\n": "<t>" takes the run after it
		},
		{"gpt4", "lstrip", cutLF, []cut{
			{"x.\n\t<t>yabc", 3, -1}}, // after "\n": "<t>" takes the run before it
		},
	} {
		name := c.pattern + " " + c.strip
		tk := cutTokenizer(t, c.pattern, c.strip)
		r := tk.cutRule()
		if !r.ok || r.kind != c.kind {
			t.Fatalf("%s: cut rule %+v, want kind %d", name, r, c.kind)
		}
		for _, k := range c.cuts {
			whole := tk.Encode(k.text)
			if isCut(r, []byte(k.text), k.wrong) {
				t.Errorf("%s: %q may be cut at %d", name, k.text, k.wrong)
			}
			if got := append(tk.Encode(k.text[:k.wrong]), tk.Encode(k.text[k.wrong:])...); firstDiff(got, whole) < 0 {
				t.Errorf("%s: %q cut at %d gives the same ids; the test would not see a wrong cut", name, k.text, k.wrong)
			}
			if k.right < 0 {
				continue
			}
			if !isCut(r, []byte(k.text), k.right) {
				t.Errorf("%s: %q may not be cut at %d", name, k.text, k.right)
			}
			if got := append(tk.Encode(k.text[:k.right]), tk.Encode(k.text[k.right:])...); firstDiff(got, whole) >= 0 {
				t.Errorf("%s: %q cut at %d: %v, want %v", name, k.text, k.right, got, whole)
			}
		}
		for trial := range 300 {
			text := cutText(rng, 1+rng.IntN(4000))
			if d := piecesMatchWhole(t, tk, text, 16+rng.IntN(200), 16+rng.IntN(500)); d != "" {
				t.Fatalf("%s, trial %d, %s, for %.300q", name, trial, d, text)
			}
		}
		if c.kind == cutLF {
			continue
		}
		for _, lines := range [][]byte{
			append([]byte("func f(k int) string {\n\tswitch k {\n"), bytes.Repeat([]byte("\tcase 1:\n\t\treturn \"one\"\n"), 2000)...),
			bytes.Repeat([]byte("x = 1;\r\nfunc f() {}\r\n"), 2000),
			// Lines that end and start in other scripts.
			bytes.Repeat([]byte("日本語の文章です。\n  Привет, мир\n"), 2000),
		} {
			if got, calls := streamIDs(t, tk, lines, 1000); calls < 10 || firstDiff(got, tk.EncodeBytes(lines)) >= 0 {
				t.Errorf("%s: %d bytes of %.20q... in %d pieces of 1000 bytes (not cut), or the ids differ", name, len(lines), lines, calls)
			}
		}
	}
}
