package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The summary of a direct ingest of a local dataset names no revision: a
// local dataset has none, where it said "local:/src/*.go at local: ...".
func TestADirectIngestOfALocalDatasetNamesNoRevision(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.go", "b.go"} {
		if err := os.WriteFile(filepath.Join(src, n), []byte("package main\nfunc "+strings.TrimSuffix(n, ".go")+"() {}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dataset := "local:" + filepath.Join(src, "*.go")
	out, errOut, code := sched(t, nil, "ingest", dataset, "--direct", "--store-dir", filepath.Join(dir, "store"), "--tokenizer-file", goldenTokenizerWithEOS(t, dir))
	if want := dataset + ": 2 files, 2 appended ("; code != 0 || !strings.HasPrefix(out, want) {
		t.Fatalf("exit %d\n%s%s\nwant the summary to begin %q", code, out, errOut, want)
	}
}
