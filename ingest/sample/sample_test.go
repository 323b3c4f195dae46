package sample

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

type textRow struct {
	Text string `parquet:"text"`
}

func parquetBytes(t *testing.T, rows []textRow) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := parquet.NewGenericWriter[textRow](&buf, parquet.MaxRowsPerRowGroup(4))
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func isBadInput(err error) bool {
	var b interface{ BadInput() bool }
	return errors.As(err, &b) && b.BadInput()
}

func TestParseMix(t *testing.T) {
	got, err := ParseMix("the-stack-v2=0.7, fineweb-edu=0.2,proof-pile-2=0.1")
	if err != nil || len(got) != 3 || got[0].Dataset != "the-stack-v2" || got[2].Dataset != "proof-pile-2" {
		t.Fatalf("%+v %v", got, err)
	}
	scaled, _ := ParseMix("a=7,b=3")
	if scaled[0].Weight != 0.7 || scaled[1].Weight != 0.3 {
		t.Fatalf("weights are not scaled to sum 1: %+v", scaled)
	}
	if g, _ := ParseMix("local:data/x=y/*.txt=1"); len(g) != 1 || g[0].Dataset != "local:data/x=y/*.txt" {
		t.Fatalf("a glob with '=' splits at the last one: %+v", g)
	}
	for in, want := range map[string]string{
		"":                 "names no dataset",
		"the-stack-v2":     `"the-stack-v2" is not dataset=weight`,
		"a=0.5,b=zero":     `weight "zero" of b`,
		"a=-1":             `weight "-1" of a`,
		"a=0":              `weight "0" of a`,
		"a=0.5,a=0.5":      "dataset a is named twice",
		"a:b=1,a-b=1":      "named twice",
		"=0.5":             "is not dataset=weight",
		"a=NaN":            `weight "NaN"`,
		"a=0.5,,b=0.5,c=x": `weight "x" of c`,
	} {
		_, err := ParseMix(in)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMix(%q) = %v, want bad input containing %q", in, err, want)
		}
	}
}

func TestParseSizeAndBudgets(t *testing.T) {
	for in, want := range map[string]int64{"2GB": 2e9, "512MiB": 512 << 20, "1.5g": 3 << 29, "1.5gb": 1.5e9, "1000": 1000, "64 KB": 64000, "3b": 3} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GB", "-1GB", "0", "two", "1e30TB", "4EiB", "5e18"} {
		if _, err := ParseSize(in); !isBadInput(err) || !strings.Contains(err.Error(), fmt.Sprintf("%q", in)) {
			t.Errorf("ParseSize(%q): %v, want bad input naming it", in, err)
		}
	}
	shares, _ := ParseMix("a=0.7,b=0.2,c=0.1")
	b := Budgets(shares, 2_000_000_001)
	if b[0]+b[1]+b[2] != 2_000_000_001 || b[1] != 400_000_000 || b[2] != 200_000_000 {
		t.Fatalf("budgets %v", b)
	}
}

func TestLabelAndPrefix(t *testing.T) {
	for in, want := range map[string]string{"the-stack-v2": "the-stack-v2", "local:data/*.jsonl.zst": "local-data-.jsonl.zst", "///": "dataset"} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
	s, _ := ParseMix("a=1")
	p1, p2 := Prefix("tok", s, 1, 100), Prefix("tok", s, 2, 100)
	if p1 == p2 || !strings.HasPrefix(p1, "tokenizers/tok/samples/") || Prefix("tok", s, 1, 100) != p1 {
		t.Fatalf("prefixes %s %s", p1, p2)
	}
}

// fakeDataset puts n parquet files of docs documents each on the fake hub;
// every document names its file, so a test can tell where text came from.
func fakeDataset(t *testing.T, h *hubtest.Hub, repo string, n, docs int) {
	t.Helper()
	for f := range n {
		var rows []textRow
		for d := range docs {
			rows = append(rows, textRow{Text: fmt.Sprintf("file-%02d doc-%02d %s", f, d, strings.Repeat("lorem ipsum ", 8))})
		}
		h.Add(repo, fmt.Sprintf("data/part-%02d.parquet", f), parquetBytes(t, rows), true)
	}
}

func filesIn(text string) map[string]bool {
	out := map[string]bool{}
	for _, doc := range strings.Split(text, Separator) {
		if name, _, ok := strings.Cut(doc, " "); ok {
			out[name] = true
		}
	}
	return out
}

// A sample from a hub dataset is spread across files chosen by the seed,
// is exactly its budget, keeps the held-out documents apart, and is the
// same for the same seed.
func TestDrawSpreadsAcrossTheDatasetBySeed(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	const repo = "owner/web"
	fakeDataset(t, h, repo, 24, 40)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	preset := ingest.Preset{Name: "web", Repo: repo, Revision: "main", Include: []string{"data/*.parquet"}, Columns: ingest.Columns{Text: "text"}}
	tmp := t.TempDir()
	draw := func(seed uint64) (string, string, Stats) {
		var s, ho bytes.Buffer
		st, err := Draw(context.Background(), Options{Preset: preset, Hub: hc, Bytes: 20_000, HeldOutBytes: 2_000, Seed: seed, Spread: 8, TempDir: tmp}, &s, &ho)
		if err != nil {
			t.Fatal(err)
		}
		return s.String(), ho.String(), st
	}
	s1, h1, st := draw(1)
	if st.Bytes != 20_000 || st.Revision != h.Commit || st.Listed != 24 || st.Short {
		t.Fatalf("stats %+v", st)
	}
	if got := int64(len(strings.ReplaceAll(s1, Separator, ""))); got != st.Bytes {
		t.Fatalf("sample holds %d bytes of text, stats say %d", got, st.Bytes)
	}
	files := filesIn(s1)
	if len(files) < 8 || st.Files < 8 {
		t.Fatalf("the sample comes from %d files (%v); the budget is spread over at least 8", len(files), files)
	}
	var first int
	for f := range 8 {
		if files[fmt.Sprintf("file-%02d", f)] {
			first++
		}
	}
	if first == len(files) {
		t.Fatalf("the sample took only the dataset's first files: %v", files)
	}
	// Each file gave at most its share (budget/8, rounded up to a document).
	for f := range files {
		if n := strings.Count(s1, f+" "); n*len("file-00 doc-00 ")+n*96 > 20_000/8+200 {
			t.Errorf("%s gave %d documents, more than its share", f, n)
		}
	}
	held, err := ReadHeldOut(strings.NewReader(h1))
	if err != nil || len(held) == 0 || st.HeldOutDocuments != int64(len(held)) {
		t.Fatalf("held-out: %d documents, %v; stats %+v", len(held), err, st)
	}
	for _, d := range held {
		if strings.Contains(s1, d) {
			t.Fatalf("held-out document %.20q is also in the sample", d)
		}
	}
	s1b, h1b, _ := draw(1)
	if s1b != s1 || h1b != h1 {
		t.Fatal("the same seed drew a different sample")
	}
	s2, _, _ := draw(2)
	if fmt.Sprint(filesIn(s2)) == fmt.Sprint(files) {
		t.Fatalf("another seed chose the same files: %v", files)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, "raw", "*", "*")); len(left) != 0 {
		t.Fatalf("downloads left behind: %v", left)
	}
}

// A local dataset (JSON lines, zstd) smaller than the budget gives what it
// has and says it ran short; bad documents are counted, not sampled.
func TestDrawLocalDatasetRunsShort(t *testing.T) {
	dir := t.TempDir()
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	for i := range 50 {
		fmt.Fprintf(zw, `{"text":"$\\sum_{k=1}^{%d} k = %d$"}`+"\n", i, i*(i+1)/2)
	}
	zw.Write([]byte(`{"text":""}` + "\n"))
	zw.Close()
	os.WriteFile(filepath.Join(dir, "a.jsonl.zst"), z.Bytes(), 0o644)
	preset, err := ingest.LookupPreset(nil, "local:"+filepath.Join(dir, "*.jsonl.zst"))
	if err != nil {
		t.Fatal(err)
	}
	var s, ho bytes.Buffer
	st, err := Draw(context.Background(), Options{Preset: preset, Bytes: 1 << 20, Seed: 3}, &s, &ho)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Short || st.Files != 1 || st.Documents+st.HeldOutDocuments != 50 || st.Skipped[ingest.SkipEmptyDocument] != 1 {
		t.Fatalf("stats %+v", st)
	}
	if !strings.Contains(s.String(), `$\sum_{k=1}^{49} k = 1225$`+Separator) && !strings.Contains(ho.String(), `1225`) {
		t.Fatal("the last document is in neither the sample nor the held-out text")
	}
}

func TestDrawStopsWhenCancelled(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	fakeDataset(t, h, "owner/web", 4, 10)
	hc, _ := hub.New(hub.Config{Endpoint: h.Server.URL})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	preset := ingest.Preset{Name: "web", Repo: "owner/web", Revision: "main", Include: []string{"data/*.parquet"}}
	_, err := Draw(ctx, Options{Preset: preset, Hub: hc, Bytes: 1000, TempDir: t.TempDir()}, &bytes.Buffer{}, &bytes.Buffer{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	_, err = Draw(context.Background(), Options{Preset: preset, Hub: hc, Bytes: 0}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "positive size") {
		t.Fatalf("a zero budget: %v", err)
	}
}

func TestCutUTF8(t *testing.T) {
	s := "aé€😀"
	for n := 0; n <= len(s); n++ {
		got := cutUTF8(s, n)
		if !strings.HasPrefix(s, got) || len(got) > n || n-len(got) >= 4 {
			t.Errorf("cutUTF8(%q, %d) = %q", s, n, got)
		}
	}
}

// Ids that differ only in their last characters, as a JSON lines file's
// do, are held out at the asked rate.
func TestHeldOutRateOnSimilarIDs(t *testing.T) {
	w := &writer{opt: Options{Seed: 1}, heldFrac: 0.2}
	held := 0
	for i := range 1000 {
		if w.heldOut(fmt.Sprintf("/tmp/data/arxiv.jsonl.zst#%d", i)) {
			held++
		}
	}
	if held < 150 || held > 250 {
		t.Fatalf("%d of 1000 held out, want about 200", held)
	}
}

// A small sample holds out at least one document whatever the seed, so its
// report has text to measure for every source; the held-out documents
// never enter the sample.
func TestSmallSampleHoldsOutADocument(t *testing.T) {
	dir := t.TempDir()
	var lines bytes.Buffer
	for i := range 4 {
		fmt.Fprintf(&lines, `{"text":"document %d of four, with some words in it"}`+"\n", i)
	}
	os.WriteFile(filepath.Join(dir, "a.jsonl"), lines.Bytes(), 0o644)
	preset, err := ingest.LookupPreset(nil, "local:"+filepath.Join(dir, "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// Enough seeds that the hash picks the first document for some and not
	// for all, whatever the ids (the documents' path is a temporary
	// directory's): with about a tenth held out, 40 seeds missed it in
	// about one run of 40 (0.91^40), 400 in none (0.91^400 = 4e-17).
	const seeds = 400
	byHash := 0
	for seed := range uint64(seeds) {
		var s, ho bytes.Buffer
		st, err := Draw(context.Background(), Options{Preset: preset, Bytes: 1000, HeldOutBytes: 100, Seed: seed}, &s, &ho)
		if err != nil {
			t.Fatal(err)
		}
		held, err := ReadHeldOut(&ho)
		if err != nil || len(held) == 0 || int64(len(held)) != st.HeldOutDocuments || st.Documents+st.HeldOutDocuments != 4 {
			t.Fatalf("seed %d: %d held-out documents (%v), stats %+v", seed, len(held), err, st)
		}
		for _, h := range held {
			if strings.Contains(s.String(), h) {
				t.Fatalf("seed %d: held-out %q is in the sample too", seed, h)
			}
		}
		if held[0] != "document 1 of four, with some words in it" {
			byHash++
		}
	}
	// The hash still decides where it picks something: the rule only
	// fills in when it picked nothing.
	if byHash == 0 || byHash == seeds {
		t.Errorf("in %d of %d seeds the held-out text starts elsewhere than the second document", byHash, seeds)
	}
}

// A force-push that replaces the commit a sample was planned at, once it
// has read a file, ends the draw in one line naming the dataset and the
// commit: at a branch the sample drawn again is planned at the new commit,
// so the error is the task's to try again (not the user's), and the draw
// made again succeeds; where the preset's revision names the commit, the
// user changes it. It used to say to run the ingest again.
func TestAForcePushDuringASampleIsDrawnAgainOrNamesThePresetsRevision(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	const repo = "owner/web"
	fakeDataset(t, h, repo, 6, 20)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	for _, pinned := range []bool{false, true} {
		old := h.Commit
		preset := ingest.Preset{Name: "web", Repo: repo, Revision: "main", Include: []string{"data/*.parquet"}, Columns: ingest.Columns{Text: "text"}}
		if pinned {
			preset.Revision = old
		}
		var pushed sync.Once
		h.SetBeforeResolve(func(context.Context, string, string) error {
			pushed.Do(func() { h.ForcePush() }) // after the first file's commit was checked
			return nil
		})
		opt := Options{Preset: preset, Hub: hc, Bytes: 8_000, Seed: 1, Spread: 6, TempDir: t.TempDir()}
		_, err := Draw(context.Background(), opt, &bytes.Buffer{}, &bytes.Buffer{})
		var gone *RevisionGoneError
		want := "the sample is drawn again, at the commit the preset's revision names now"
		if pinned {
			want = "which the preset's revision names, is gone from the hub (RevisionNotFound: a force-push replaced it): set the preset's revision to a commit the dataset has, or to a branch, then run sched enqueue tokenizer again"
		}
		switch {
		case !errors.As(err, &gone) || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "ingest"):
			t.Fatalf("pinned %v: the draw across a force-push: %v; want one line of the sample's", pinned, err)
		case isBadInput(err) != pinned:
			t.Fatalf("pinned %v: %v is the user's to fix: %v; want %v", pinned, err, isBadInput(err), pinned)
		case !strings.Contains(err.Error(), "sample of web: commit "+old+" of dataset "+repo) || !strings.Contains(err.Error(), want):
			t.Fatalf("pinned %v: %v; want the commit named and %q", pinned, err, want)
		}
		h.SetBeforeResolve(nil)
		if pinned {
			opt.Preset.Revision = h.Commit
		}
		if st, err := Draw(context.Background(), opt, &bytes.Buffer{}, &bytes.Buffer{}); err != nil || st.Revision != h.Commit || st.Bytes != 8_000 {
			t.Fatalf("pinned %v: the draw made again: %+v, %v; want the whole budget at %s", pinned, st, err, h.Commit)
		}
	}
}

// A sample's warnings add no "dataset" key of their own: the caller's
// logger names the dataset (the worker's names its task's), and a line
// with the key twice is one some JSON readers refuse.
func TestDrawWarningsNameTheDatasetOnce(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("a short file of text\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "b.txt"), []byte{0xff, 0xfe, 0x00, 0x01}, 0o644); err != nil {
		t.Fatal(err)
	}
	name := "local:" + filepath.Join(dir, "*.txt")
	preset, err := ingest.LookupPreset(nil, name)
	if err != nil {
		t.Fatal(err)
	}
	var lines bytes.Buffer
	enc := zap.NewProductionEncoderConfig()
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(&lines), zap.InfoLevel)).With(zap.String("dataset", name))
	var s, ho bytes.Buffer
	st, err := Draw(context.Background(), Options{Preset: preset, Bytes: 1 << 20, Seed: 3, Logger: log}, &s, &ho)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Short {
		t.Fatalf("stats %+v: want a sample that ran short", st)
	}
	warned := 0
	for _, line := range strings.Split(strings.TrimSpace(lines.String()), "\n") {
		if strings.Count(line, `"dataset":`) != 1 {
			t.Errorf("log line %s: want one \"dataset\" key", line)
		}
		if strings.Contains(line, "ran out before the budget") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("log:\n%swant one warning that the dataset ran out", lines.String())
	}
}
