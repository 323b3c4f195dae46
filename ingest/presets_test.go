package ingest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

func TestEmbeddedPresets(t *testing.T) {
	ps, err := Presets("")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"the-stack-v2", "opc-fineweb-code", "python-edu", "fineweb-edu", "proof-pile-2"} {
		p, ok := ps[name]
		if !ok || p.Revision != "main" {
			t.Fatalf("preset %s: %+v", name, p)
		}
	}
	if ps["fineweb-edu"].Repo != "HuggingFaceFW/fineweb-edu" || !ps["fineweb-edu"].Match("sample/100BT/000_00000.parquet") {
		t.Fatalf("fineweb-edu: %+v", ps["fineweb-edu"])
	}
	stack, err := ps["the-stack-v2"].WithVars(map[string][]string{"language": {"Python", "Go"}})
	if err != nil {
		t.Fatal(err)
	}
	if !stack.Match("data/Go/train-00001.parquet") || stack.Match("data/Rust/train-00001.parquet") {
		t.Fatal("the language filter does not select files")
	}
	if got := strings.Join(stack.ListRoots(), ","); got != "data/Python,data/Go" {
		t.Fatalf("list roots %q", got)
	}
	if _, err := stack.WithVars(map[string][]string{"lang": {"Go"}}); err == nil || !strings.Contains(err.Error(), "language") {
		t.Fatalf("unknown var: %v", err)
	}
	if !ps["proof-pile-2"].Match("arxiv/train/arXiv_000.jsonl.zst") {
		t.Fatal("proof-pile-2 layout")
	}
	_, err = LookupPreset(ps, "the-stak")
	if err == nil || !strings.Contains(err.Error(), "the-stack-v2") {
		t.Fatalf("unknown preset should list the known ones: %v", err)
	}
	if p, err := LookupPreset(ps, "local:/data/*.txt"); err != nil || p.Glob != "/data/*.txt" {
		t.Fatalf("local preset: %+v %v", p, err)
	}
}

func TestPresetOverride(t *testing.T) {
	f := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(f, []byte("fineweb-edu:\n  repo: mirror/fineweb\n  include: ['*.parquet']\n"), 0o644)
	ps, err := Presets(f)
	if err != nil || ps["fineweb-edu"].Repo != "mirror/fineweb" || ps["the-stack-v2"].Repo == "" {
		t.Fatalf("%v %+v", err, ps["fineweb-edu"])
	}
	os.WriteFile(f, []byte("mine:\n  repo: o/d\n  include: ['*.parquet']\n  columns:\n    txt: content\n"), 0o644)
	if _, err := Presets(f); err == nil || !strings.Contains(err.Error(), f+`: not valid preset YAML: line 5: unknown key "txt" (did you mean text?); the keys here are blob, encoding, id, text`) {
		t.Fatalf("misspelt column key: %v", err)
	}
	os.WriteFile(f, []byte("bad:\n  repo: nope\n"), 0o644)
	if _, err := Presets(f); err == nil || !strings.Contains(err.Error(), `preset "bad"`) {
		t.Fatalf("bad preset: %v", err)
	}
	// Entries no ingest could use are refused with the file, not queued
	// to fail on a worker.
	for yaml, want := range map[string]string{
		"'../up':\n  repo: o/d\n  include: ['*.parquet']\n":                         `preset "../up": `,
		"'a b':\n  repo: o/d\n  include: ['*.parquet']\n":                           `preset "a b": `,
		"'local:x':\n  repo: o/d\n  include: ['*.parquet']\n":                       `a name beginning "local:" names a local glob`,
		"mine:\n  repo: o/d\n  include: ['{lang}/*.parquet']\n":                     `include pattern "{lang}/*.parquet" uses {lang}, which vars does not define`,
		"mine:\n  repo: o/d\n  include: ['{lang}/*.parquet']\n  vars: {lang: []}\n": `vars.lang lists no values`,
	} {
		os.WriteFile(f, []byte(yaml), 0o644)
		if _, err := Presets(f); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v; want an error saying %q", yaml, err, want)
		}
	}
	os.WriteFile(f, []byte("mine:\n  repo: o/d\n  include: ['{lang}/*.parquet']\n  vars: {lang: [Go, C]}\n"), 0o644)
	if ps, err := Presets(f); err != nil || len(ps["mine"].Patterns()) != 2 {
		t.Fatalf("a preset with its vars: %v, %v", err, ps["mine"].Patterns())
	}
}

func TestCheckReadsColumnsWithoutDownloading(t *testing.T) {
	h := hubtest.New()
	defer h.Close()
	content := parquetBytes(t, []textRow{{Text: "a"}, {Text: "b"}})
	h.Add("o/d", "data/a.parquet", content, true)
	hc, _ := hub.New(hub.Config{Endpoint: h.Server.URL})
	p := Preset{Name: "d", Repo: "o/d", Revision: "main", Include: []string{"data/*.parquet"}}
	res, err := Check(context.Background(), p, hc)
	if err != nil || res.Revision != h.Commit || res.Files != 1 || strings.Join(res.Columns, ",") != "text" {
		t.Fatalf("%+v %v", res, err)
	}
	for _, r := range h.Requests() {
		if r.Host == "cdn" && r.Range == "" {
			t.Fatal("check downloaded a whole file")
		}
	}
	p.Columns.Text = "content"
	if _, err := Check(context.Background(), p, hc); err == nil || !strings.Contains(err.Error(), `no column "content"`) {
		t.Fatalf("missing column: %v", err)
	}
}

// A local dataset's check reads the first file's first document through
// ingest's own reader: a JSON lines file whose lines lack the text field,
// or a parquet file without the column, is refused by name before any
// ingest, and a good one says how it is read.
func TestCheckReadsALocalFilesFirstDocument(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(glob string, cols Columns) (CheckResult, error) {
		p, err := LookupPreset(nil, LocalPrefix+glob)
		if err != nil {
			t.Fatal(err)
		}
		p.Columns = cols
		return Check(context.Background(), p, nil)
	}

	write("a.jsonl", `{"text":"package main"}`+"\n"+`{"text":"x"}`+"\n")
	res, err := check(filepath.Join(dir, "a.jsonl"), Columns{})
	if err != nil || res.Format != FormatJSONL || res.FirstDocument != len("package main") ||
		!strings.Contains(res.Describe(Columns{}), `JSON lines, each line's field "text" read; its first document reads 12 bytes`) {
		t.Fatalf("good JSON lines: %+v %v (%s)", res, err, res.Describe(Columns{}))
	}
	if _, err := check(filepath.Join(dir, "a.jsonl"), Columns{Text: "content"}); !isPresetError(err) ||
		!strings.Contains(err.Error(), "a.jsonl gave no document, every record skipped") || !strings.Contains(err.Error(), `("content")`) {
		t.Fatalf("JSON lines without the field: %v; want the file and the field named", err)
	}

	pq := filepath.Join(dir, "b.parquet")
	os.WriteFile(pq, parquetBytes(t, []textRow{{Text: "first"}, {Text: "second"}}), 0o644)
	res, err = check(pq, Columns{})
	if err != nil || strings.Join(res.Columns, ",") != "text" || res.FirstDocument != len("first") ||
		!strings.Contains(res.Describe(Columns{}), "b.parquet has columns [text]") {
		t.Fatalf("good parquet: %+v %v", res, err)
	}
	if _, err := check(pq, Columns{Text: "content"}); !isPresetError(err) || !strings.Contains(err.Error(), `b.parquet has no column "content" (columns: [text])`) {
		t.Fatalf("parquet without the column: %v; want the file named", err)
	}
	if _, err := check(pq, Columns{Blob: "blob_id"}); !isPresetError(err) || !strings.Contains(err.Error(), `no column "blob_id"`) {
		t.Fatalf("parquet without the blob column: %v", err)
	}
	write("c.parquet", "not parquet at all")
	if _, err := check(filepath.Join(dir, "c.parquet"), Columns{}); !isPresetError(err) || !strings.Contains(err.Error(), "c.parquet is not readable parquet") {
		t.Fatalf("a text file named .parquet: %v", err)
	}

	write("d.txt", "plain words")
	res, err = check(filepath.Join(dir, "d.txt"), Columns{})
	if err != nil || !strings.Contains(res.Describe(Columns{}), "d.txt is plain text, each file one document; its first document reads 11 bytes") {
		t.Fatalf("plain text: %+v %v", res, err)
	}
	write("e.txt", "")
	if _, err := check(filepath.Join(dir, "e.txt"), Columns{}); !isPresetError(err) || !strings.Contains(err.Error(), "its one file holds no document (") ||
		!strings.Contains(err.Error(), "e.txt") {
		t.Fatalf("an empty file: %v; want it named", err)
	}
	// A text file is its one document: one not UTF-8, or an archive, is
	// passed over as an ingest skips it, named with its reason, not
	// refused as a field that holds no text.
	f := write("f.txt", "caf\xe9")
	if _, err := check(filepath.Join(dir, "[f].txt"), Columns{}); !isPresetError(err) ||
		!strings.Contains(err.Error(), "its one file holds no document ("+f+": invalid-utf8)") {
		t.Fatalf("a text file not UTF-8 alone: %v; want it named with its reason", err)
	}
	var tgz bytes.Buffer
	zw := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(zw)
	tw.WriteHeader(&tar.Header{Name: "a.go", Mode: 0o644, Size: 2})
	tw.Write([]byte("ok"))
	tw.Close()
	zw.Close()
	g := write("g.txt.gz", tgz.String())
	if _, err := check(filepath.Join(dir, "[fg].txt*"), Columns{}); !isPresetError(err) ||
		!strings.Contains(err.Error(), "none of its 2 files holds a document (") || !strings.Contains(err.Error(), f+": invalid-utf8") ||
		!strings.Contains(err.Error(), g+": archive") {
		t.Fatalf("two text files skipped whole: %v; want both passed over, named with their reasons", err)
	}
	// More files than a check passes over: it says how many it read.
	many := filepath.Join(dir, "many")
	if err := os.Mkdir(many, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range localCheckFiles + 1 {
		write(filepath.Join("many", fmt.Sprintf("%d.txt", i)), "")
	}
	if _, err := check(filepath.Join(many, "*.txt"), Columns{}); !isPresetError(err) ||
		!strings.Contains(err.Error(), fmt.Sprintf("the first %d of its %d files hold no document (", localCheckFiles, localCheckFiles+1)) {
		t.Fatalf("more empty files than a check reads: %v", err)
	}
	// With a good one among them, the files before it in the plan's
	// order are passed over, and the check says so.
	h := write("h.txt", "the good one")
	glob := filepath.Join(dir, "[fgh].txt*")
	res, err = check(glob, Columns{})
	if err != nil || res.Sample != h || res.FirstDocument != len("the good one") {
		t.Fatalf("a good text file among skipped ones: %+v, %v; want the good one read", res, err)
	}
	p, err := LookupPreset(nil, LocalPrefix+glob)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := Plan(context.Background(), p, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var before []string
	for _, pf := range plan.Files {
		if pf.Path == h {
			break
		}
		before = append(before, map[string]string{f: f + ": invalid-utf8", g: g + ": archive"}[pf.Path])
	}
	if !slices.Equal(res.PassedOver, before) || (len(before) > 0) != strings.Contains(res.Describe(Columns{}), "(passed over before it, as an ingest skips them: ") {
		t.Fatalf("passed over %q (%s); want %q", res.PassedOver, res.Describe(Columns{}), before)
	}
	// An empty file first in the plan's order is passed over for the next.
	res, err = check(filepath.Join(dir, "[de].txt"), Columns{})
	if err != nil || res.FirstDocument != 11 || !strings.HasSuffix(res.Sample, "d.txt") {
		t.Fatalf("an empty and a good file: %+v %v", res, err)
	}
}

func isPresetError(err error) bool {
	var pe *PresetError
	return errors.As(err, &pe)
}

// A task's carried preset is used as it is when it is the dataset's and
// reads as a presets file's entry would; otherwise the task is refused
// (bad input, naming the dataset), and a task that carries none is looked
// up in the worker's presets.
func TestResolvePresetTakesTheCarriedPreset(t *testing.T) {
	mine := Preset{Name: "mine", Repo: "org/mine", Revision: "main", Include: []string{"data/*.jsonl"}, Columns: Columns{Text: "body"}}
	b, err := json.Marshal(PlanJob{Dataset: "mine", Preset: Carried(mine)})
	if err != nil {
		t.Fatal(err)
	}
	var job PlanJob
	if err := json.Unmarshal(b, &job); err != nil {
		t.Fatal(err)
	}
	got, err := ResolvePreset(nil, "mine", job.Preset)
	if err != nil || !reflect.DeepEqual(got, mine) {
		t.Fatalf("carried through JSON: %+v, %v; want %+v", got, err, mine)
	}
	if Carried(Preset{Name: "local:/x/*.go", Glob: "/x/*.go"}) != nil {
		t.Fatal("a local dataset's preset is carried; its name describes it")
	}
	worker := map[string]Preset{"mine": {Name: "mine", Repo: "org/workers", Include: []string{"*"}}}
	if got, err := ResolvePreset(worker, "mine", nil); err != nil || got.Repo != "org/workers" {
		t.Fatalf("no carried preset: %+v, %v; want the worker's", got, err)
	}
	bad := mine
	bad.Repo = "not-a-repo"
	for _, c := range []struct {
		carried *Preset
		want    string
	}{
		{&Preset{Name: "other", Repo: "org/other", Include: []string{"*"}}, `names dataset "mine" but carries the preset of "other"`},
		{&bad, `the task's preset of "mine": repo "not-a-repo"`},
	} {
		_, err := ResolvePreset(worker, "mine", c.carried)
		var pe *PresetError
		if !errors.As(err, &pe) || !pe.BadInput() || !strings.Contains(err.Error(), c.want) {
			t.Errorf("carried %+v: %v; want a PresetError with %q", c.carried, err, c.want)
		}
	}
}
