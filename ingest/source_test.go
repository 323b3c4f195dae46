package ingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"golang.org/x/text/encoding/charmap"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

type codeRow struct {
	Content *string `parquet:"content,optional"`
	Path    string  `parquet:"path"`
}

type blobRow struct {
	BlobID      string `parquet:"blob_id"`
	SrcEncoding string `parquet:"src_encoding"`
}

func writeParquet[T any](t *testing.T, path string, rows []T, perGroup int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := parquet.NewGenericWriter[T](f, parquet.MaxRowsPerRowGroup(perGroup), parquet.PageBufferSize(256))
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func readAll(t *testing.T, path string, opt OpenOptions) ([]Document, Skips, error) {
	t.Helper()
	src, err := Open(context.Background(), path, opt)
	if err != nil {
		return nil, nil, err
	}
	defer src.Close()
	return drainAll(src)
}

// drainAll reads every document of src and what it skipped.
func drainAll(src Source) ([]Document, Skips, error) {
	var docs []Document
	err := Drain(context.Background(), src, func(d Document) error { docs = append(docs, d); return nil })
	return docs, src.Skipped(), err
}

func strp(s string) *string { return &s }

func TestParquetStreamsRowGroupsAndSkips(t *testing.T) {
	dir := t.TempDir()
	var rows []codeRow
	var want []string
	for i := range 50 {
		text := fmt.Sprintf("func f%d() {}\n%s", i, strings.Repeat("x", i*37))
		rows = append(rows, codeRow{Content: strp(text), Path: fmt.Sprintf("p%d.go", i)})
		want = append(want, text)
	}
	rows[7].Content = nil                       // a null
	rows[8].Content = strp("")                  // empty
	rows[9].Content = strp("bad \xff\xfe utf8") // invalid UTF-8
	want = append(want[:7], want[10:]...)
	path := filepath.Join(dir, "train-0.parquet")
	writeParquet(t, path, rows, 8)

	docs, skips, err := readAll(t, path, OpenOptions{Name: "data/train-0.parquet", Columns: Columns{Text: "content", ID: "path"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != len(want) {
		t.Fatalf("got %d documents, want %d", len(docs), len(want))
	}
	for i, d := range docs {
		if d.Text != want[i] {
			t.Fatalf("document %d differs", i)
		}
	}
	if docs[0].ID != "p0.go" || docs[7].ID != "p10.go" {
		t.Fatalf("ids from the id column: %q, %q", docs[0].ID, docs[7].ID)
	}
	if skips[SkipEmptyDocument] != 2 || skips[SkipInvalidUTF8] != 1 {
		t.Fatalf("skips: %v", skips)
	}

	docs, _, err = readAll(t, path, OpenOptions{Name: "x.parquet", Columns: Columns{Text: "content"}})
	if err != nil || docs[3].ID != "x.parquet#3" {
		t.Fatalf("row ids: %v %+v", err, docs[3].ID)
	}
}

func TestBadFilesAreSkipErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.parquet")
	writeParquet(t, good, []codeRow{{Content: strp("a"), Path: "a"}}, 10)
	b, _ := os.ReadFile(good)

	corrupt := filepath.Join(dir, "corrupt.parquet")
	os.WriteFile(corrupt, append(bytes.Repeat([]byte("garbage!"), 100), b[len(b)-20:]...), 0o644)
	empty := filepath.Join(dir, "empty.jsonl.zst")
	os.WriteFile(empty, nil, 0o644)

	var zbuf bytes.Buffer
	zw, _ := zstd.NewWriter(&zbuf)
	for i := range 2000 {
		fmt.Fprintf(zw, `{"text":"document %d with some words to compress"}`+"\n", i)
	}
	zw.Close()
	truncated := filepath.Join(dir, "truncated.jsonl.zst")
	os.WriteFile(truncated, zbuf.Bytes()[:zbuf.Len()/2], 0o644)

	cases := []struct {
		path, reason string
		cols         Columns
	}{
		{corrupt, SkipCorruptFile, Columns{Text: "content"}},
		{empty, SkipEmptyFile, Columns{}},
		{truncated, SkipCorruptFile, Columns{}},
		{good, SkipMissingColumn, Columns{Text: "text"}},
	}
	for _, c := range cases {
		_, _, err := readAll(t, c.path, OpenOptions{Columns: c.cols})
		if got := SkipReason(err); got != c.reason {
			t.Errorf("%s: want skip %q, got %v", filepath.Base(c.path), c.reason, err)
		}
	}
}

func TestJSONLinesCompressed(t *testing.T) {
	dir := t.TempDir()
	lines := `{"text":"alpha","meta":{"a":1}}` + "\n" +
		`{"text":null}` + "\n" +
		"{\"text\":\"bad \xff\"}\n" +
		"\n" +
		`{"text":"beta\nline"}` + "\n" +
		`{"other":"x"}`
	write := func(name string, enc func([]byte) []byte) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, enc([]byte(lines)), 0o644)
		return p
	}
	plain := write("a.jsonl", func(b []byte) []byte { return b })
	gz := write("a.jsonl.gz", func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	})
	zst := write("a.jsonl.zst", func(b []byte) []byte {
		var buf bytes.Buffer
		w, _ := zstd.NewWriter(&buf)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	})
	for _, p := range []string{plain, gz, zst} {
		docs, skips, err := readAll(t, p, OpenOptions{Name: "a"})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if len(docs) != 2 || docs[0].Text != "alpha" || docs[1].Text != "beta\nline" || docs[1].ID != "a#4" {
			t.Fatalf("%s: documents %+v", p, docs)
		}
		if skips[SkipEmptyDocument] != 2 || skips[SkipInvalidUTF8] != 1 {
			t.Fatalf("%s: skips %v", p, skips)
		}
	}
}

// A byte-order mark before the first line (PowerShell's UTF-8, some
// editors) is not part of the JSON: the file reads as without it, where
// it was a corrupt file skipped whole.
func TestJSONLinesAfterAByteOrderMark(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bom.jsonl")
	os.WriteFile(p, []byte("\uFEFF"+`{"text":"alpha"}`+"\n"+`{"text":"beta"}`+"\n"), 0o644)
	docs, _, err := readAll(t, p, OpenOptions{Name: "bom"})
	if err != nil || len(docs) != 2 || docs[0].Text != "alpha" || docs[1].Text != "beta" {
		t.Fatalf("JSON lines after a byte-order mark: %+v, %v; want alpha and beta", docs, err)
	}
}

func TestTextFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "main.go")
	os.WriteFile(p, []byte("package main\n"), 0o644)
	docs, _, err := readAll(t, p, OpenOptions{Name: "local/main.go"})
	if err != nil || len(docs) != 1 || docs[0].Text != "package main\n" || docs[0].ID != "local/main.go" {
		t.Fatalf("%v %+v", err, docs)
	}
	bad := filepath.Join(t.TempDir(), "bad.txt")
	os.WriteFile(bad, []byte{0xff, 0xfe, 0xfd}, 0o644)
	docs, _, err = readAll(t, bad, OpenOptions{})
	if SkipReason(err) != SkipInvalidUTF8 || len(docs) != 0 {
		t.Fatalf("invalid UTF-8 text file: %v %+v; want the file skipped as %s", err, docs, SkipInvalidUTF8)
	}
}

func blobID(i int) string { return fmt.Sprintf("%040x", i+1) }

func TestSoftwareHeritageBlobs(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	fake.SetFlaky(true)
	fake.SetBarrier(32)
	var rows []blobRow
	var want []string
	for i := range 300 {
		id, enc := blobID(i), "UTF-8"
		text := fmt.Sprintf("print(%d)\n", i)
		switch {
		case i%50 == 3: // missing from the archive
			rows = append(rows, blobRow{BlobID: id, SrcEncoding: enc})
			continue
		case i%50 == 4:
			enc = "x-klingon"
			fake.Add(id, []byte(text))
			rows = append(rows, blobRow{BlobID: id, SrcEncoding: enc})
			continue
		case i%50 == 5:
			enc = "ISO-8859-1"
			text = "caf\u00e9 = 1\n"
			b, _ := charmap.ISO8859_1.NewEncoder().Bytes([]byte(text))
			fake.Add(id, b)
		default:
			fake.Add(id, []byte(text))
		}
		rows = append(rows, blobRow{BlobID: id, SrcEncoding: enc})
		want = append(want, text)
	}
	path := filepath.Join(t.TempDir(), "ids.parquet")
	writeParquet(t, path, rows, 64)

	swh := &SWH{Endpoint: fake.URL() + "/", InFlight: 64}
	docs, skips, err := readAll(t, path, OpenOptions{SWH: swh, Columns: Columns{Blob: "blob_id", Encoding: "src_encoding"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) != len(want) {
		t.Fatalf("got %d documents, want %d (skips %v)", len(docs), len(want), skips)
	}
	for i := range docs {
		if docs[i].Text != want[i] {
			t.Fatalf("document %d: %q, want %q (order must follow the rows)", i, docs[i].Text, want[i])
		}
	}
	if skips[SkipMissingBlob] != 6 || skips[SkipUnknownEncoding] != 6 {
		t.Fatalf("skips: %v", skips)
	}
	if fake.Peak() < 32 {
		t.Fatalf("at most %d requests were in flight; want many", fake.Peak())
	}
}

func TestSoftwareHeritageDenied(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, `<Error><Code>AccessDenied</Code></Error>`)
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "ids.jsonl")
	os.WriteFile(path, []byte(`{"blob_id":"`+blobID(1)+`"}`+"\n"), 0o644)
	_, _, err := readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: srv.URL}, Columns: Columns{Blob: "blob_id"}})
	if err == nil || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") || !strings.Contains(err.Error(), "AccessDenied") {
		t.Fatalf("want a clear 403 error, got %v", err)
	}
}

// A bucket that keeps failing is given up on with its answer first, so
// that a one-line listing of the failure keeps it.
func TestSoftwareHeritageDownIsGivenUpOnWithItsAnswerFirst(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	fake.SetDown(true)
	fake.Add(blobID(1), []byte("print(1)\n"))
	path := filepath.Join(t.TempDir(), "ids.jsonl")
	os.WriteFile(path, []byte(`{"blob_id":"`+blobID(1)+`"}`+"\n"), 0o644)
	_, _, err := readAll(t, path, OpenOptions{SWH: &SWH{Endpoint: fake.URL(), MaxRetries: 1}, Columns: Columns{Blob: "blob_id"}})
	want := "Software Heritage (" + fake.URL() + "): 503 SlowDown (given up after 2 attempts at blob " + blobID(1) + ")"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a bucket that answers 503: %v; want %q", err, want)
	}
}

func TestSoftwareHeritageCloseStopsInFlight(t *testing.T) {
	fake := hubtest.NewSWH()
	defer fake.Close()
	gate := make(chan struct{})
	defer close(gate)
	fake.SetGate(gate)
	var rows []blobRow
	for i := range 100 {
		rows = append(rows, blobRow{BlobID: blobID(i)})
	}
	path := filepath.Join(t.TempDir(), "ids.parquet")
	writeParquet(t, path, rows, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	src, err := Open(ctx, path, OpenOptions{SWH: &SWH{Endpoint: fake.URL(), InFlight: 16}, Columns: Columns{Blob: "blob_id"}})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := src.Next(ctx); err == nil {
		t.Fatal("Next after cancel returned a document")
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}

type numberedRow struct {
	ID   int64  `parquet:"id"`
	Text string `parquet:"text"`
	Lang int32  `parquet:"lang"`
}

// Many datasets' id column is an int64: it is read as its decimal text.
// Before, reading it as bytes panicked, and every file was skipped as
// corrupt. A text column of numbers is refused as the preset's to fix,
// naming the column and what it holds, by the reader and by the check.
func TestParquetReadsANumberIDAndRefusesANumberText(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "part-0.parquet")
	var rows []numberedRow
	for i := range 20 {
		rows = append(rows, numberedRow{ID: int64(1000 + i), Text: fmt.Sprintf("document %d", i), Lang: 7})
	}
	writeParquet(t, path, rows, 10)
	docs, _, err := readAll(t, path, OpenOptions{Name: "part-0.parquet", Columns: Columns{Text: "text", ID: "id"}})
	if err != nil || len(docs) != 20 || docs[0].ID != "1000" || docs[19].ID != "1019" || docs[19].Text != "document 19" {
		t.Fatalf("an int64 id column: %d documents (%+v ...), %v; want 20 with ids 1000 to 1019", len(docs), docs[:min(len(docs), 1)], err)
	}
	_, _, err = readAll(t, path, OpenOptions{Name: "part-0.parquet", Columns: Columns{Text: "lang"}})
	if SkipReason(err) != SkipMissingColumn || !strings.Contains(err.Error(), `column "lang" holds INT32 values, not text`) {
		t.Errorf("an int32 text column: %v (%s); want a missing-column skip naming it", err, SkipReason(err))
	}
	p := Preset{Name: "local:" + filepath.Join(dir, "*.parquet"), Glob: filepath.Join(dir, "*.parquet"), Columns: Columns{Text: "lang"}}
	var pe *PresetError
	if _, err := Check(context.Background(), p, nil); !errors.As(err, &pe) || !strings.Contains(err.Error(), `column "lang" holds INT32 values, not text`) {
		t.Errorf("the check of an int32 text column: %v; want a preset error naming it", err)
	}
}

// A .json file whose first line is a JSON object with the field read is
// JSON lines (many datasets keep them so); any other .json (a
// package.json, a config, a line without the field) is source text, read
// whole. A .json.gz or .json.zst file is told alike by its head
// decompressed, and a compressed config read as its text, where each was
// JSON lines by its name. sched datasets check says which, of a local
// file and of a hub dataset's, whose head alone it fetches.
func TestAJSONFileIsReadAsItsFirstLineSays(t *testing.T) {
	for _, ext := range compressions {
		t.Run("json"+ext, func(t *testing.T) { testAJSONFileIsReadAsItsFirstLineSays(t, ext) })
	}
}

func testAJSONFileIsReadAsItsFirstLineSays(t *testing.T, ext string) {
	dir := t.TempDir()
	files := map[string]string{
		"lines.json":   "\uFEFF" + `{"text":"alpha","n":1}` + "\n" + `{"text":"beta"}` + "\n",
		"package.json": "{\n  \"name\": \"x\",\n  \"text\": \"not a document\"\n}\n",
		"other.json":   `{"body":"alpha"}` + "\n" + `{"body":"beta"}` + "\n",
	}
	for name, body := range files {
		writeAs(t, filepath.Join(dir, name+ext), body)
	}
	for name, want := range map[string][]string{
		"lines.json":   {"alpha", "beta"},
		"package.json": {files["package.json"]},
		"other.json":   {files["other.json"]},
	} {
		docs, _, err := readAll(t, filepath.Join(dir, name+ext), OpenOptions{Name: name})
		var got []string
		for _, d := range docs {
			got = append(got, d.Text)
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s%s read as %q, %v; want %q", name, ext, got, err, want)
		}
	}
	docs, _, err := readAll(t, filepath.Join(dir, "other.json"+ext), OpenOptions{Name: "other.json", Columns: Columns{Text: "body"}})
	if err != nil || len(docs) != 2 || docs[0].Text != "alpha" {
		t.Errorf("other.json%s read with the field body: %+v, %v; want its 2 lines", ext, docs, err)
	}
	for name, want := range map[string]Format{"lines.json": FormatJSONL, "package.json": FormatText} {
		local := Preset{Name: "local:" + filepath.Join(dir, name+ext), Glob: filepath.Join(dir, name+ext)}
		if res, err := Check(context.Background(), local, nil); err != nil || res.Format != want {
			t.Errorf("the check of %s%s: %+v, %v; want %s", name, ext, res, err, want)
		}
	}

	h := hubtest.New()
	defer h.Close()
	h.Add("owner/lines", "data/part-0.json"+ext, compressedAs(t, ext, []byte(files["lines.json"])), false)
	h.Add("owner/configs", "data/package.json"+ext, compressedAs(t, ext, []byte(files["package.json"])), false)
	wants := map[string]Format{"owner/lines": FormatJSONL, "owner/configs": FormatText}
	if ext == ".gz" {
		// Stored uncompressed (gzip's level 0): the head's first line
		// ends past the file's first jsonSniffBytes bytes, all that the
		// check's first request fetches.
		var b bytes.Buffer
		w, _ := gzip.NewWriterLevel(&b, gzip.NoCompression)
		fmt.Fprintf(w, `{"text":"%s"}`+"\n"+`{"text":"beta"}`+"\n", strings.Repeat("x", jsonSniffBytes-32))
		w.Close()
		if b.Len() <= jsonSniffBytes {
			t.Fatalf("the stored file is %d bytes; want more than the first request fetches", b.Len())
		}
		h.Add("owner/stored", "data/part-0.json.gz", b.Bytes(), true)
		wants["owner/stored"] = FormatJSONL
	}
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	for repo, want := range wants {
		p := Preset{Name: "p", Repo: repo, Revision: "main", Include: []string{"data/*.json" + ext}}
		if res, err := Check(context.Background(), p, hc); err != nil || res.Format != want {
			t.Errorf("the check of %s: %+v, %v; want %s", repo, res, err, want)
		}
	}
}
