package ingest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/tokens"
)

// jsonArray is elements, each a JSON value written as it is, as one
// pretty-printed array: an element on lines of its own, indented.
func jsonArray(elements []string) string {
	return "[\n  " + strings.Join(elements, ",\n  ") + "\n]\n"
}

// compressions are the ways a .json file is kept that are read alike: as
// it is, gzipped (.json.gz) and zstd-compressed (.json.zst), as exporters
// write them.
var compressions = []string{"", ".gz", ".zst"}

// compressedAs is body as a file named name holds it: gzipped for a .gz
// name, zstd-compressed for a .zst one, as it is for any other.
func compressedAs(t testing.TB, name string, body []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	var w io.WriteCloser
	switch {
	case strings.HasSuffix(name, ".gz"):
		w = gzip.NewWriter(&b)
	case strings.HasSuffix(name, ".zst"):
		z, err := zstd.NewWriter(&b)
		if err != nil {
			t.Fatal(err)
		}
		w = z
	default:
		return body
	}
	if _, err := w.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// writeAs writes body to path as a file of its name holds it (compressedAs).
func writeAs(t testing.TB, path, body string) string {
	t.Helper()
	if err := os.WriteFile(path, compressedAs(t, path, []byte(body)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// texts are the documents' texts.
func texts(docs []Document) []string {
	var out []string
	for _, d := range docs {
		out = append(out, d.Text)
	}
	return out
}

// A .json file that holds one JSON array of objects (pretty-printed, after
// a byte-order mark) is read an element a time, each element's field as
// the same object on a JSON line is: the same documents, ids and records
// left out. Where the first element holds no field read the file is
// source text, as a .json whose first line holds none; an empty array
// holds no document. sched datasets check says which, of a local file and
// of a hub dataset's. A .json.gz or .json.zst file is told and read alike,
// through its decompressor: an array of records, where it was read as
// JSON lines by its name and skipped as corrupt, and text decompressed.
func TestAJSONArrayIsReadAnElementADocument(t *testing.T) {
	for _, ext := range compressions {
		t.Run("json"+ext, func(t *testing.T) { testAJSONArrayIsReadAnElementADocument(t, ext) })
	}
}

func testAJSONArrayIsReadAnElementADocument(t *testing.T, ext string) {
	dir := t.TempDir()
	elements := []string{
		`{"id": "a", "text": "alpha"}`,
		`{"id": 7, "text": "beta\non two lines", "meta": {"text": "nested, not read"}}`,
		`{"text": null}`,
		`{"text": ""}`,
		`{"text": 42}`,
		`null`,
		"{\"text\": \"bad \xff bytes\"}",
		`{"text": "gamma \u00e9", "id": ""}`,
	}
	write := func(name, body string) string {
		t.Helper()
		return writeAs(t, filepath.Join(dir, name+ext), body)
	}
	array := write("array.json", "\uFEFF"+jsonArray(elements))
	lines := write("lines.json", strings.Join(elements, "\n")+"\n")
	opt := OpenOptions{Name: "f.json", Columns: Columns{ID: "id"}}
	docs, skips, err := readAll(t, array, opt)
	want := []Document{{ID: "a", Text: "alpha"}, {ID: "7", Text: "beta\non two lines"}, {ID: "f.json#4", Text: "42"}, {ID: "f.json#7", Text: "gamma é"}}
	if err != nil || !slices.Equal(docs, want) || skips.String() != "empty-document=3, invalid-utf8=1" {
		t.Fatalf("the array read as %+v, skipped %v, %v; want %+v, skipped empty-document=3, invalid-utf8=1", docs, skips, err, want)
	}
	ldocs, lskips, err := readAll(t, lines, opt)
	if err != nil || !slices.Equal(ldocs, docs) || lskips.String() != skips.String() {
		t.Fatalf("its elements as JSON lines: %+v, skipped %v, %v; want what the array gave", ldocs, lskips, err)
	}

	// The field named first, a first document longer than the head read
	// to tell the format does not make the file text.
	long := strings.Repeat("the quick brown fox ", jsonSniffBytes/10)
	first, _ := json.Marshal(map[string]string{"text": long})
	bodyJSON := jsonArray([]string{`{"body": "one", "n": [1, {"x": 2}]}`, `{"body": "two"}`})
	body := write("body.json", bodyJSON)
	config := "{\n  \"name\": \"x\",\n  \"text\": \"not a document\"\n}\n"
	for _, c := range []struct {
		path string
		cols Columns
		want []string
	}{
		{write("long.json", jsonArray([]string{string(first), `{"text": "short"}`})), Columns{}, []string{long, "short"}},
		{body, Columns{Text: "body"}, []string{"one", "two"}},
		{body, Columns{}, []string{bodyJSON}},
		{write("fixtures.json", `[{"name": "x", "value": 1}]`), Columns{}, []string{`[{"name": "x", "value": 1}]`}},
		{write("numbers.json", "[1, 2, 3]\n"), Columns{}, []string{"[1, 2, 3]\n"}},
		{write("config.json", config), Columns{}, []string{config}},
	} {
		docs, _, err := readAll(t, c.path, OpenOptions{Name: filepath.Base(c.path), Columns: c.cols})
		if got := texts(docs); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s read with %+v: %d documents %.60q, %v; want %.60q", filepath.Base(c.path), c.cols, len(got), got, err, c.want)
		}
	}
	if _, _, err := readAll(t, write("empty.json", " [ ]\n"), OpenOptions{Name: "empty.json"}); SkipReason(err) != SkipEmptyFile {
		t.Errorf("an empty array: %v; want the file skipped as empty", err)
	}

	local := func(path string, cols Columns) Preset {
		return Preset{Name: "local:" + path, Glob: path, Columns: cols}
	}
	ctx := context.Background()
	res, err := Check(ctx, local(array, Columns{}), nil)
	if err != nil || res.Format != FormatJSONArray || res.FirstDocument != len("alpha") ||
		!strings.Contains(res.Describe(Columns{}), `array.json`+ext+` is a JSON array, each element's field "text" read; its first document reads 5 bytes`) {
		t.Errorf("the check of array.json%s: %+v, %v (%s); want a JSON array", ext, res, err, res.Describe(Columns{}))
	}
	res, err = Check(ctx, local(body, Columns{}), nil)
	if err != nil || res.Format != FormatText || !strings.Contains(res.Describe(Columns{}), `body.json`+ext+` is plain text, each file one document (a .json file is read as records where its first line or array element is an object holding the field "text")`) {
		t.Errorf("the check of body.json%s read with the field text: %+v, %v (%s); want plain text, and why", ext, res, err, res.Describe(Columns{}))
	}
	if res, err = Check(ctx, local(body, Columns{Text: "body"}), nil); err != nil || res.Format != FormatJSONArray {
		t.Errorf("the check of body.json%s read with the field body: %+v, %v; want a JSON array", ext, res, err)
	}

	h := hubtest.New()
	defer h.Close()
	add := func(repo, path, body string, lfs bool) {
		h.Add(repo, path+ext, compressedAs(t, path+ext, []byte(body)), lfs)
	}
	add("owner/array", "data/part-0.json", "\uFEFF"+jsonArray(elements), true)
	add("owner/long", "data/part-0.json", jsonArray([]string{string(first)}), true)
	add("owner/fixtures", "data/fixtures.json", `[{"name": "x"}]`, false)
	add("owner/configs", "data/config.json", config, false)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	for repo, want := range map[string]Format{"owner/array": FormatJSONArray, "owner/long": FormatJSONArray, "owner/fixtures": FormatText, "owner/configs": FormatText} {
		p := Preset{Name: "p", Repo: repo, Revision: "main", Include: []string{"data/*.json" + ext}}
		if res, err := Check(ctx, p, hc); err != nil || res.Format != want {
			t.Errorf("the check of %s: %+v, %v; want %s", repo, res, err, want)
		}
	}
}

// An array cut short or malformed part-way ends its file as corrupt, as a
// JSON line that is not an object does, and so does an element that is
// not an object, and a compressed file cut short; an element over
// MaxLineBytes ends it as too-large, not held whole; each error names the
// file and the element, of a .json, .json.gz or .json.zst file alike.
func TestABrokenJSONArrayIsSkippedAsItsFileIs(t *testing.T) {
	for _, ext := range compressions {
		t.Run("json"+ext, func(t *testing.T) { testABrokenJSONArrayIsSkippedAsItsFileIs(t, ext) })
	}
}

func testABrokenJSONArrayIsSkippedAsItsFileIs(t *testing.T, ext string) {
	dir := t.TempDir()
	huge := `{"text": "` + strings.Repeat("x", MaxLineBytes) + `"}`
	var many []string // in zstd blocks of 128 KiB, the first whole before the cut
	for i := range 50000 {
		many = append(many, fmt.Sprintf(`{"text": "document %d"}`, i))
	}
	for _, c := range []struct {
		name, body string
		cut        bool // the file's bytes, compressed where it is, cut in half
		reason     string
		says       string
	}{
		{"cut.json", `[{"text": "a"}, {"text": "b"}, {"text": "c`, false, SkipCorruptFile, "after element 2 of the array: unexpected EOF"},
		{"cut-between.json", "[{\"text\": \"a\"},\n  ", false, SkipCorruptFile, "after element 1 of the array: unexpected EOF"},
		{"no-end.json", `[{"text": "a"}`, false, SkipCorruptFile, "after element 1 of the array: unexpected EOF"},
		{"bad-syntax.json", `[{"text": "a"}, {"text": }]`, false, SkipCorruptFile, "after element 1 of the array: invalid character '}'"},
		{"no-comma.json", `[{"text": "a"} {"text": "b"}]`, false, SkipCorruptFile, "after element 1 of the array: expected comma after array element"},
		{"more.json", `[{"text": "a"}] [{"text": "b"}]`, false, SkipCorruptFile, "after element 1 of the array: more after the array's end"},
		{"not-object.json", `[{"text": "a"}, "b", {"text": "c"}]`, false, SkipCorruptFile, "element 2 of the array is not a JSON object"},
		{"huge.json", `[{"text": "a"}, ` + huge + `, {"text": "c"}]`, false, SkipTooLarge, "element 2 of the array is over 64 MiB"},
		{"cut-file.json", jsonArray(many), true, SkipCorruptFile, "unexpected EOF"},
	} {
		name := c.name + ext
		path := writeAs(t, filepath.Join(dir, name), c.body)
		if c.cut {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, b[:len(b)/2], 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if f := formatOfFile(path, Columns{}); f != FormatJSONArray {
			t.Fatalf("%s reads as %s; want a JSON array: the test would not test it", name, f)
		}
		_, _, err := readAll(t, path, OpenOptions{Name: "data/" + name})
		if SkipReason(err) != c.reason || !strings.Contains(err.Error(), "data/"+name) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v; want it skipped as %s, saying %q", name, err, c.reason, c.says)
		}
	}
}

// arrayFile is a JSON array of the partial-ingest fixture's documents and
// left-out records (partFile), compressed as path's name says
// (compressedAs), and the documents it holds.
func arrayFile(t *testing.T, path string, f, rows int) []string {
	t.Helper()
	records, docs := partFile(f, rows)
	var elements []string
	for _, r := range records {
		b, _ := json.Marshal(map[string]string{"text": r.Text})
		if !strings.Contains(r.Text, "\xff") {
			elements = append(elements, string(b))
			continue
		}
		elements = append(elements, `{"text": "`+r.Text+`"}`) // bytes json.Marshal would replace
	}
	writeAs(t, path, jsonArray(elements))
	return docs
}

// A JSON array's elements are numbered as JSON lines are: an ingest under
// a limit smaller than the file takes its leading elements, and a larger
// limit the rest from the element after them, so that the store holds
// each element's document once, as a one-shot ingest does, with the same
// records left out; a compressed array's rest is read through its
// decompressor from its start, to the element after the part.
func TestAJSONArrayIsTakenInPartsEachElementOnce(t *testing.T) {
	for _, ext := range compressions {
		t.Run("json"+ext, func(t *testing.T) { testAJSONArrayIsTakenInPartsEachElementOnce(t, ext) })
	}
}

func testAJSONArrayIsTakenInPartsEachElementOnce(t *testing.T, ext string) {
	dir := t.TempDir()
	files := filepath.Join(dir, "files")
	os.MkdirAll(files, 0o755)
	var all []string
	for f := range 2 {
		all = append(all, arrayFile(t, filepath.Join(files, fmt.Sprintf("part-%d.json%s", f, ext)), f, 40+f)...)
	}
	preset, err := LookupPreset(nil, "local:"+filepath.Join(files, "*.json"+ext))
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	ctx := context.Background()
	opt := DirectOptions{Preset: preset, Tokenizer: tok, TokenizerName: "t", StoreDir: filepath.Join(dir, "whole"), DataDir: filepath.Join(dir, "data")}
	if rep, err := Direct(ctx, opt); err != nil || rep.Appended != 2 {
		t.Fatalf("one-shot ingest: %+v, %v", rep, err)
	}
	ref, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil {
		t.Fatal(err)
	}
	sameDocs(t, storeDocs(t, tok, opt.StoreDir, all), all)
	if leftOut(ref) != "empty-document=10, invalid-utf8=10" {
		t.Fatalf("the one-shot ingest left out %s; want each file's empty and invalid elements", leftOut(ref))
	}

	opt.StoreDir = filepath.Join(dir, "parts")
	var held []string
	for i, limit := range []int64{ref.Shards[0].Tokens * 2 / 5, ref.Shards[0].Tokens + ref.Shards[1].Tokens/2, 0} {
		opt.MaxTokens = limit
		rep, err := Direct(ctx, opt)
		if err != nil || (limit > 0) != (rep.Partial == 1) {
			t.Fatalf("run %d, at --max-tokens %d: %+v, %v; want a file taken in part where limited", i, limit, rep, err)
		}
		m, err := tokens.ReadManifest(opt.StoreDir)
		if err != nil {
			t.Fatal(err)
		}
		if limit > 0 && (m.Tokens > limit || m.Shards[len(m.Shards)-1].Part.To == 0) {
			t.Fatalf("run %d: %d tokens at --max-tokens %d, shards %+v", i, m.Tokens, limit, m.Shards)
		}
		docs := storeDocs(t, tok, opt.StoreDir, all)
		if len(docs) <= len(held) || !slices.Equal(docs[:len(held)], held) {
			t.Fatalf("run %d: the store holds %d documents, %d before; want those before kept and more", i, len(docs), len(held))
		}
		held = docs
	}
	sameDocs(t, held, all)
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || m.Tokens != ref.Tokens || m.Documents != ref.Documents || leftOut(m) != leftOut(ref) {
		t.Fatalf("the store in parts: %+v, %v; one-shot: %d tokens, %d documents, left out %s", m, err, ref.Tokens, ref.Documents, leftOut(ref))
	}
}

// The rest of a JSON array taken in part that is cut short past the part
// (a compressed one, its stream cut) is recorded as left out after it, as
// a JSON lines file's is: the part stays in the store as it was.
func TestTheRestOfACutJSONArrayIsLeftOutAndItsPartKept(t *testing.T) {
	for _, ext := range compressions {
		t.Run("json"+ext, func(t *testing.T) { testTheRestOfACutJSONArrayIsLeftOutAndItsPartKept(t, ext) })
	}
}

func testTheRestOfACutJSONArrayIsLeftOutAndItsPartKept(t *testing.T, ext string) {
	dir := t.TempDir()
	path := filepath.Join(dir, "files", "cut.json"+ext)
	os.MkdirAll(filepath.Dir(path), 0o755)
	all := arrayFile(t, path, 0, 20000)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	preset, err := LookupPreset(nil, "local:"+path)
	if err != nil {
		t.Fatal(err)
	}
	tok := testTokenizer(t)
	ctx := context.Background()
	opt := DirectOptions{Preset: preset, Tokenizer: tok, TokenizerName: "t", StoreDir: filepath.Join(dir, "store"), DataDir: filepath.Join(dir, "data"), MaxTokens: 300}
	rep, err := Direct(ctx, opt)
	if err != nil || rep.Partial != 1 || rep.Tokens <= 0 || rep.Tokens > opt.MaxTokens {
		t.Fatalf("the file's leading elements: %+v, %v", rep, err)
	}
	part := storeDocs(t, tok, opt.StoreDir, all)
	opt.MaxTokens = 0
	if rep, err = Direct(ctx, opt); err != nil || rep.SkippedFiles[SkipCorruptFile] != 1 || rep.Tokens != 0 {
		t.Fatalf("the rest: %+v, %v; want it recorded as a corrupt file's", rep, err)
	}
	m, err := tokens.ReadManifest(opt.StoreDir)
	if err != nil || len(m.Shards) != 2 {
		t.Fatalf("manifest: %+v, %v; want the part and the rest", m, err)
	}
	rest := slices.IndexFunc(m.Skipped, func(s tokens.Skipped) bool { return strings.HasPrefix(s.Reason, SkipCorruptFile+": ") })
	if rest < 0 || m.Skipped[rest].From != m.Shards[0].Part.To || m.Skipped[rest].Count != 0 || !strings.Contains(m.Skipped[rest].Reason, "unexpected EOF") {
		t.Fatalf("left out: %+v; want the rest, from the part's end, cut short", m.Skipped)
	}
	if got := storeDocs(t, tok, opt.StoreDir, all); !slices.Equal(got, part) {
		t.Fatalf("the store holds %d documents after the rest; want the part's %d as they were", len(got), len(part))
	}
}
