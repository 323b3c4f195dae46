package catalog

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
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokenizer/tokenizertest"
	"github.com/kiln-lm/kiln/tokens"
)

func newS3(t *testing.T) store.Store {
	t.Helper()
	srv := testsvc.S3(t)
	s, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// train learns a small vocabulary from texts.
func train(t testing.TB, vocab int, texts ...string) []byte {
	t.Helper()
	var in []io.Reader
	for _, s := range texts {
		in = append(in, strings.NewReader(s))
	}
	b, err := tokenizer.Train(context.Background(), in, tokenizer.TrainOptions{VocabSize: vocab})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func isBadInput(err error) bool {
	var b interface{ BadInput() bool }
	return errors.As(err, &b) && b.BadInput()
}

// A tokenizer's name follows the rule of every name (store.CheckName): a
// catalog of its own would drift from it. A leading '-' is refused, since
// the hints print the name in a command (mkdir -p .../tokenizers/-x).
func TestCheckNameIsTheStoreRule(t *testing.T) {
	for _, name := range []string{"mix-16384", "7b", "-x", "--vocab", ".x", "_x", "a/b", ""} {
		err, want := CheckName(name), store.CheckName("tokenizer", name)
		if (err == nil) != (want == nil) || (err != nil && (err.Error() != want.Error() || !isBadInput(err))) {
			t.Errorf("%q: %v; want %v as bad input", name, err, want)
		}
	}
	if err := CheckName("-x"); err == nil || !strings.Contains(err.Error(), "starting with a letter or digit") {
		t.Errorf("-x: %v; want the rule that names start with a letter or digit", err)
	}
}

// A tokenizer published on one machine is found by name on another through
// object storage, copied to that machine's data directory, and identical.
func TestPublishOnOneMachineResolveOnAnother(t *testing.T) {
	ctx := context.Background()
	objects := newS3(t)
	a, b := New(objects, t.TempDir()), New(objects, t.TempDir())
	data := train(t, 300, "the cat sat on the mat, the cat sat on the hat")
	pub, err := a.Publish(ctx, "small", data)
	if err != nil {
		t.Fatal(err)
	}
	e, tok, err := b.Resolve(ctx, "small")
	if err != nil {
		t.Fatal(err)
	}
	if e.SHA256 != pub.SHA256 || e.VocabSize != tok.VocabSize() || !e.HasEOS || len(e.Special) != 1 || e.Special[0] != "<|endoftext|>" {
		t.Fatalf("resolved %+v, published %+v", e, pub)
	}
	local, err := os.ReadFile(filepath.Join(b.Dir, "small", "tokenizer.json"))
	if err != nil || !bytes.Equal(local, data) {
		t.Fatalf("no identical local copy on the second machine: %v", err)
	}
	// A retried publish of the same bytes succeeds and changes nothing.
	if _, err := a.Publish(ctx, "small", data); err != nil {
		t.Fatalf("republishing the same bytes: %v", err)
	}
	names, err := b.Names(ctx)
	if err != nil || len(names) != 1 || names[0] != "small" {
		t.Fatalf("names %v %v", names, err)
	}
}

// A published name never changes meaning: other bytes under it are refused
// with both hashes named, and the stored file is kept.
func TestPublishingOtherBytesUnderAKnownNameIsRefused(t *testing.T) {
	ctx := context.Background()
	objects := newS3(t)
	c := New(objects, t.TempDir())
	first := train(t, 300, "alpha beta gamma alpha beta gamma")
	second := train(t, 300, "func main() { return nil } func main() { return nil }")
	e1, err := c.Publish(ctx, "v1", first)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(objects, t.TempDir()).Publish(ctx, "v1", second)
	var ce *ConflictError
	if !errors.As(err, &ce) || !isBadInput(err) {
		t.Fatalf("got %v, want a ConflictError", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, e1.SHA256) || !strings.Contains(msg, sha(second)) || !strings.Contains(msg, "another name") {
		t.Fatalf("error does not name both tokenizers and the fix: %s", msg)
	}
	rc, err := objects.Get(ctx, Key("v1"))
	if err != nil {
		t.Fatal(err)
	}
	kept, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(kept, first) {
		t.Fatal("the published tokenizer was replaced")
	}
}

// A local copy that differs from the published one is refused, not used.
func TestResolveRefusesALocalCopyThatDiffers(t *testing.T) {
	ctx := context.Background()
	objects := newS3(t)
	dir := t.TempDir()
	c := New(objects, dir)
	if _, err := c.Publish(ctx, "tok", train(t, 300, "one two three one two three")); err != nil {
		t.Fatal(err)
	}
	other := train(t, 280, "x y z x y z x y z")
	if err := os.WriteFile(filepath.Join(dir, "tokenizers", "tok", FileName), other, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := c.Resolve(ctx, "tok")
	var ce *ConflictError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), sha(other)) || !strings.Contains(err.Error(), "object storage tokenizers/tok/tokenizer.json") {
		t.Fatalf("got %v", err)
	}
}

// A local tokenizer.json past the most one may be (a wrong file put in
// its place) is refused naming it, unread, as a file given by path is.
func TestResolveRefusesAnOversizedLocalCopy(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	objects, err := store.NewLocal(filepath.Join(dir, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	c := New(objects, dir)
	path := filepath.Join(dir, "tokenizers", "big", FileName)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(256<<20 + 1); err != nil { // sparse: no disk taken
		t.Fatal(err)
	}
	f.Close()
	_, _, err = c.Resolve(ctx, "big")
	var bad interface{ BadInput() bool }
	if !errors.As(err, &bad) || !bad.BadInput() || !strings.Contains(err.Error(), path+": is larger than 256 MiB") {
		t.Fatalf("resolve of an oversized local copy: %v; want bad input naming %s", err, path)
	}
}

func TestResolveUnknownNameListsTheKnownOnes(t *testing.T) {
	ctx := context.Background()
	c := New(nil, t.TempDir())
	if _, err := c.Publish(ctx, "kiln-bpe", train(t, 290, "a b c a b c")); err != nil {
		t.Fatal(err)
	}
	_, _, err := c.Resolve(ctx, "nope")
	var nf *NotFoundError
	if !errors.As(err, &nf) || !isBadInput(err) || !strings.Contains(err.Error(), "known: kiln-bpe") || !strings.Contains(err.Error(), "sched enqueue tokenizer nope") {
		t.Fatalf("got %v", err)
	}
	for _, bad := range []string{"", "a/b", "../x", ".hidden", "has space"} {
		if _, _, err := c.Resolve(ctx, bad); !isBadInput(err) {
			t.Errorf("name %q: got %v, want bad input", bad, err)
		}
	}
}

// makeStore writes a token store with one shard made by tokenizer data.
func makeStore(t *testing.T, dir, name string, data []byte) tokens.Tokenizer {
	t.Helper()
	tok, err := tokenizer.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	tk := tokens.Tokenizer{Name: name, SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}
	app, err := tokens.OpenAppender(context.Background(), dir, tk, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	var buf bytes.Buffer
	for _, id := range append(tok.Encode("some text for the store"), eos) {
		binary.Write(&buf, binary.LittleEndian, uint16(id))
	}
	if _, err := app.Append(context.Background(), tokens.ShardInfo{ID: "s1"}, &buf); err != nil {
		t.Fatal(err)
	}
	return tk
}

// Training on stores made by different tokenizers is refused with an error
// naming both stores and both tokenizers.
func TestTrainingOnStoresOfDifferentTokenizersIsRefused(t *testing.T) {
	root := t.TempDir()
	codeTok := train(t, 300, "func f() { return x } func g() { return y }")
	proseTok := train(t, 300, "the quick brown fox jumps over the lazy dog")
	makeStore(t, filepath.Join(root, "code"), "code-bpe", codeTok)
	makeStore(t, filepath.Join(root, "code2"), "code-bpe", codeTok)
	makeStore(t, filepath.Join(root, "prose"), "prose-bpe", proseTok)
	var stores []Store
	for _, n := range []string{"code", "code2", "prose"} {
		s, err := StoreOf(filepath.Join(root, n))
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	if err := CheckStores(stores[:2]); err != nil {
		t.Fatalf("two stores of one tokenizer: %v", err)
	}
	err := CheckStores(stores)
	var me *MismatchError
	if !errors.As(err, &me) || !isBadInput(err) {
		t.Fatalf("got %v, want a MismatchError", err)
	}
	for _, want := range []string{filepath.Join(root, "code"), filepath.Join(root, "prose"), "code-bpe", "prose-bpe", sha(codeTok), sha(proseTok)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %s", want, err)
		}
	}
	if CheckStores(nil) != nil || CheckStores(stores[2:]) != nil {
		t.Fatal("no store, or one store, cannot mismatch")
	}

	// A run or an ingest that names another tokenizer than the store's.
	c := New(nil, t.TempDir())
	e, err := c.Publish(context.Background(), "prose-bpe", proseTok)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckUses(stores[2], e); err != nil {
		t.Fatal(err)
	}
	err = CheckUses(stores[0], e)
	if !errors.As(err, &me) || !strings.Contains(err.Error(), "--tokenizer code-bpe") || !strings.Contains(err.Error(), sha(proseTok)) {
		t.Fatalf("got %v", err)
	}
}

// Appending with another tokenizer is refused by the store itself; its
// error names both tokenizers and both hashes.
func TestAppendingWithAnotherTokenizerIsRefused(t *testing.T) {
	dir := t.TempDir()
	first := makeStore(t, dir, "one", train(t, 300, "one two three four"))
	otherData := train(t, 300, "five six seven eight")
	other, _ := tokenizer.Parse(otherData)
	eos, _ := other.EOS()
	_, err := tokens.OpenAppender(context.Background(), dir, tokens.Tokenizer{Name: "two", SHA256: other.SHA256(), VocabSize: other.VocabSize(), EOS: eos}, nil)
	if err == nil {
		t.Fatal("append with another tokenizer was accepted")
	}
	for _, want := range []string{"one", first.SHA256, "two", other.SHA256()} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %s", want, err)
		}
	}
	if m, _ := tokens.ReadManifest(dir); m.Tokens == 0 || m.Tokenizer.SHA256 != first.SHA256 {
		t.Fatal("the refused append changed the store")
	}
}

// mathsCorpus is LaTeX-flavoured mathematics: definitions, inequalities,
// sums and integrals with varying symbols, as in arXiv sources.
func mathsCorpus(seed uint64, n int) string {
	r := rand.New(rand.NewPCG(seed, 1))
	vars := []string{"x", "y", "n", "k", "t", "\\alpha", "\\beta", "\\lambda", "\\epsilon", "z"}
	fns := []string{"f", "g", "h", "\\phi", "\\psi"}
	sets := []string{"\\mathbb{R}", "\\mathbb{N}", "\\mathbb{Z}", "\\mathbb{C}", "[0,1]"}
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	var b strings.Builder
	for i := 0; i < n; i++ {
		v, w, f, s := pick(vars), pick(vars), pick(fns), pick(sets)
		switch r.IntN(5) {
		case 0:
			fmt.Fprintf(&b, "\\begin{lemma}\\label{lem:%d} Let $%s \\colon %s \\to %s$ be continuous. Then for every $%s > 0$ there is $\\delta > 0$ such that $|%s(%s) - %s(%s)| < %s$ whenever $|%s - %s| < \\delta$.\\end{lemma}\n",
				i, f, s, s, "\\epsilon", f, v, f, w, "\\epsilon", v, w)
		case 1:
			fmt.Fprintf(&b, "\\begin{equation} \\sum_{%s=1}^{N} \\frac{1}{%s^{%d}} \\le %d + \\int_{1}^{N} \\frac{d%s}{%s^{%d}} \\end{equation}\n", v, v, 2+r.IntN(3), 1+r.IntN(3), w, w, 2+r.IntN(3))
		case 2:
			fmt.Fprintf(&b, "\\begin{proof} By induction on $%s$. The case $%s = 0$ is immediate. Assume the claim for $%s$; then $%s(%s+1) = %s(%s) + %d\\,%s$, and the bound follows from \\eqref{eq:%d}. \\end{proof}\n",
				v, v, v, f, v, f, v, 1+r.IntN(9), w, r.IntN(50))
		case 3:
			fmt.Fprintf(&b, "We write $\\|%s\\|_{L^%d(%s)} = \\left( \\int_{%s} |%s(%s)|^{%d} \\, d%s \\right)^{1/%d}$ for the norm.\n", f, 2+r.IntN(2), s, s, f, v, 2, v, 2)
		default:
			fmt.Fprintf(&b, "\\begin{theorem} For all $%s \\in %s$ and $%s \\ge %d$, $\\left|\\sum_{%s} a_{%s} %s^{%s}\\right| \\le C \\cdot %s^{%d}$.\\end{theorem}\n", v, s, w, r.IntN(5), w, w, v, w, v, r.IntN(4))
		}
	}
	return b.String()
}

// The report on a mixed corpus: a tokenizer trained on code, prose and
// maths compresses each, and beats one trained on prose alone on code and
// maths, while the prose-only one keeps its lead on prose.
func TestReportOnAMixedCorpus(t *testing.T) {
	ctx := context.Background()
	goSrc, pySrc, prose := tokenizertest.Text(t, "go"), tokenizertest.Text(t, "python"), tokenizertest.Text(t, "english")
	maths := mathsCorpus(1, 2400)
	code := goSrc + pySrc
	// The last fifth of each is held out.
	split := func(s string) (string, string) { c := len(s) * 4 / 5; return s[:c], s[c:] }
	codeTrain, codeHeld := split(code)
	proseTrain, proseHeld := split(prose)
	mathsTrain, mathsHeld := split(maths)
	const vocab = 2048
	c := New(newS3(t), t.TempDir())
	prevData := train(t, vocab, proseTrain)
	prev, err := c.Publish(ctx, "prose-only", prevData)
	if err != nil {
		t.Fatal(err)
	}
	mixed, err := c.Publish(ctx, "mixed", train(t, vocab, codeTrain, proseTrain, mathsTrain))
	if err != nil {
		t.Fatal(err)
	}
	_, mixedTok, err := c.Resolve(ctx, "mixed")
	if err != nil {
		t.Fatal(err)
	}
	_, prevTok, err := c.Resolve(ctx, "prose-only")
	if err != nil {
		t.Fatal(err)
	}
	held := []HeldOut{{"code", tokenizertest.Documents(codeHeld, 2000)}, {"prose", tokenizertest.Documents(proseHeld, 2000)}, {"maths", tokenizertest.Documents(mathsHeld, 2000)}}
	rep, err := Measure(ctx, mixed, mixedTok, &prev, prevTok, held)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PutReport(ctx, rep); err != nil {
		t.Fatal(err)
	}
	got, ok, err := New(c.Objects, t.TempDir()).GetReport(ctx, "mixed")
	if err != nil || !ok || len(got.Sources) != 3 || got.Previous == nil || got.Previous.Name != "prose-only" {
		t.Fatalf("stored report %+v ok=%v err=%v", got, ok, err)
	}
	if rep.VocabSize != vocab || len(rep.SpecialTokens) != 1 || rep.SpecialTokens[0] != "<|endoftext|>" {
		t.Fatalf("vocab %d specials %v", rep.VocabSize, rep.SpecialTokens)
	}
	by := map[string]SourceReport{}
	for _, s := range rep.Sources {
		by[s.Source] = s
		var n int64
		for _, d := range heldOf(held, s.Source) {
			n += int64(len(d))
		}
		if s.Bytes != n || s.Tokens == 0 || s.BytesPerToken <= 1 || s.Previous == nil {
			t.Fatalf("source %s: %+v", s.Source, s)
		}
	}
	for _, s := range []string{"code", "maths"} {
		if by[s].BytesPerToken <= by[s].Previous.BytesPerToken {
			t.Errorf("%s: the mixed tokenizer packs %.3f bytes/token, the prose-only one %.3f; the mixture should win on %s",
				s, by[s].BytesPerToken, by[s].Previous.BytesPerToken, s)
		}
	}
	if by["prose"].Previous.BytesPerToken <= by["prose"].BytesPerToken {
		t.Errorf("prose: the prose-only tokenizer (%.3f) should beat the mixture (%.3f) on its own kind of text",
			by["prose"].Previous.BytesPerToken, by["prose"].BytesPerToken)
	}
	md := rep.Markdown()
	for _, want := range []string{"| code |", "| prose |", "| maths |", "prose-only bytes/token", `"<|endoftext|>"`, "vocabulary: 2048 ids"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	t.Logf("\n%s", md)
}

func heldOf(h []HeldOut, src string) []string {
	for _, x := range h {
		if x.Source == src {
			return x.Docs
		}
	}
	return nil
}

// Usage finds the stores on disk and the runs whose newest checkpoint
// carries each tokenizer.
func TestUsageNamesStoresAndRuns(t *testing.T) {
	ctx := context.Background()
	objects := newS3(t)
	root := t.TempDir()
	c := New(objects, root)
	a, b := train(t, 300, "red green blue red green blue"), train(t, 300, "one two one two one two")
	ea, _ := c.Publish(ctx, "a", a)
	eb, _ := c.Publish(ctx, "b", b)
	tokensDir := filepath.Join(root, "tokens")
	makeStore(t, filepath.Join(tokensDir, "colours"), "a", a)
	makeStore(t, filepath.Join(tokensDir, "numbers"), "b", b)
	put := func(key string, data []byte) {
		if err := objects.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	// run1 moved from tokenizer b to a: its newest checkpoint decides.
	put("checkpoints/run1/step-0000010/tokenizer.json", b)
	put("checkpoints/run1/step-0000020/tokenizer.json", a)
	put("checkpoints/run2/step-0000005/tokenizer.json", b)
	put("checkpoints/run2/step-0000005/config.json", []byte("{}"))
	u, err := c.Usage(ctx, tokensDir)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(u.Stores[ea.SHA256], u.Runs[ea.SHA256]) != "[colours] [run1]" || fmt.Sprint(u.Stores[eb.SHA256], u.Runs[eb.SHA256]) != "[numbers] [run2]" {
		t.Fatalf("usage %+v", u)
	}
}

// A report of a training that yielded fewer ids than asked says so, with
// what to do; one that yielded them all says nothing of it.
func TestReportSaysWhenTheCorpusYieldedFewerIDs(t *testing.T) {
	r := Report{Name: "mix", SHA256: "abc", VocabSize: 5275, Asked: 16384}
	if md := r.Markdown(); !strings.Contains(md, "fewer ids than asked**: the corpus yields 5275 ids of the 16384 asked") {
		t.Errorf("report:\n%s", md)
	}
	r.Asked = 0
	if md := r.Markdown(); strings.Contains(md, "fewer ids") {
		t.Errorf("report of a full vocabulary:\n%s", md)
	}
}

// While object storage does not answer, a tokenizer this machine holds is
// resolved from its copy, and one it lacks fails naming the outage.
func TestResolveUsesTheLocalCopyWhileObjectStorageIsDown(t *testing.T) {
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	data := train(t, 300, tokenizertest.Text(t, "go"))
	here := New(objects, t.TempDir())
	if _, err := here.Publish(ctx, "code", data); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	e, tok, err := here.Resolve(ctx, "code")
	if err != nil || tok == nil || e.SHA256 != sha(data) {
		t.Fatalf("resolved during the outage: %+v, %v; want the local copy", e, err)
	}
	_, _, err = New(objects, t.TempDir()).Resolve(ctx, "code")
	if err == nil || !store.Unreachable(err) {
		t.Fatalf("a machine without a copy resolved during the outage: %v", err)
	}
}
