package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
)

func TestIngestDirectLocalThenDatasets(t *testing.T) {
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	data := filepath.Join(dir, "src")
	os.MkdirAll(data, 0o755)
	os.WriteFile(filepath.Join(data, "a.jsonl"), []byte(`{"text":"package main"}`+"\n"+`{"text":"func f() {}"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(data, "b.jsonl"), []byte("{\"text\":\"bad \xff\"}\n"), 0o644)
	stores := filepath.Join(dir, "stores")
	out, errOut, code := runModelCLI(t, "ingest", "local:"+filepath.Join(data, "*.jsonl"), "--direct",
		"--store", filepath.Join(stores, "local"), "--tokenizer", tok)
	if code != 0 || !strings.Contains(out, "2 files, 1 appended") || !strings.Contains(out, "empty-file=1") {
		t.Fatalf("ingest: code %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = runModelCLI(t, "datasets", "--stores", stores)
	if code != 0 || !strings.Contains(out, "the-stack-v2") || !strings.Contains(out, "bigcode/the-stack-v2-dedup") ||
		!strings.Contains(out, "local") || !strings.Contains(out, "empty-file=1") {
		t.Fatalf("datasets: code %d\n%s\n%s", code, out, errOut)
	}

	_, errOut, code = runModelCLI(t, "ingest", "no-such-dataset", "--direct", "--store", dir, "--tokenizer", tok)
	if code != 2 || !strings.Contains(errOut, `unknown dataset "no-such-dataset"`) {
		t.Fatalf("unknown dataset: code %d, %s", code, errOut)
	}
	_, errOut, code = runModelCLI(t, "ingest", "fineweb-edu", "--direct", "--store", dir, "--tokenizer", tok, "--max-tokens", "lots")
	if code != 2 || !strings.Contains(errOut, "--max-tokens") {
		t.Fatalf("bad --max-tokens: code %d, %s", code, errOut)
	}
}

func TestParseCountAndBytes(t *testing.T) {
	if n, _ := parseCount("25B"); n != 25_000_000_000 {
		t.Fatalf("25B = %d", n)
	}
	if n, _ := parseBytes("50GiB"); n != 50<<30 {
		t.Fatalf("50GiB = %d", n)
	}
	if n, _ := parseBytes("512M"); n != 512<<20 {
		t.Fatalf("512M = %d", n)
	}
}

// goldenTokenizerWithEOS trains a small tokenizer (with <|endoftext|>) into dir.
func goldenTokenizerWithEOS(t *testing.T, dir string) string {
	t.Helper()
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("package main\nfunc f() {}\n", 100))}, tokenizer.TrainOptions{VocabSize: 280})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tok.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
