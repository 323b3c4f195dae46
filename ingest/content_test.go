package ingest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/tokens"
)

// zstJSONL is n JSON lines of text, zstd-compressed; cut keeps that many
// bytes of it (0: all), which makes a corrupt file.
func zstJSONL(prefix string, n, cut int) []byte {
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	for i := range n {
		fmt.Fprintf(zw, `{"text":"%s line %d: the quick brown fox"}`+"\n", prefix, i)
	}
	zw.Close()
	if cut > 0 {
		return z.Bytes()[:cut]
	}
	return z.Bytes()
}

// A local file is one shard by its content: the same files under other glob
// spellings append nothing, a second copy of a file is a duplicate, and a
// file skipped as corrupt is read again once its content changes.
func TestDirectLocalFilesAreTheirContent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for i := range 3 {
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d.jsonl.zst", i)), zstJSONL(fmt.Sprintf("file %d", i), 40, 0), 0o644)
	}
	whole := zstJSONL("late", 200, 0)
	corrupt := filepath.Join(dir, "late.jsonl.zst")
	os.WriteFile(corrupt, whole[:len(whole)/2], 0o644)
	storeDir := t.TempDir()
	run := func(glob string) Report {
		t.Helper()
		p, err := LookupPreset(nil, "local:"+glob)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Direct(ctx, DirectOptions{Preset: p, Tokenizer: testTokenizer(t), TokenizerName: "t", StoreDir: storeDir, DataDir: t.TempDir()})
		if err != nil {
			t.Fatalf("ingest of %s: %v", glob, err)
		}
		return rep
	}
	rep := run(filepath.Join(dir, "*.jsonl.zst"))
	if rep.Appended != 3 || rep.SkippedFiles[SkipCorruptFile] != 1 {
		t.Fatalf("first ingest: %+v; want 3 appended and the cut file skipped as corrupt", rep)
	}
	m1, err := tokens.ReadManifest(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	// Other spellings of the same files, and a copy of one under a new name.
	data, _ := os.ReadFile(filepath.Join(dir, "f0.jsonl.zst"))
	os.WriteFile(filepath.Join(dir, "copy-of-f0.jsonl.zst"), data, 0o644)
	for _, glob := range []string{dir + "/./*.jsonl.zst", dir + "//f*.jsonl.zst", filepath.Join(dir, "..", filepath.Base(dir)) + "/*.zst", dir + "/*"} {
		rep := run(glob)
		if rep.Appended != 0 || rep.Tokens != 0 || len(rep.SkippedFiles) != 0 {
			t.Fatalf("ingest of %s: %+v; want nothing appended or skipped again", glob, rep)
		}
	}
	m2, _ := tokens.ReadManifest(storeDir)
	if m2.Tokens != m1.Tokens || len(m2.Shards) != 3 || len(m2.Skipped) != len(m1.Skipped) {
		t.Fatalf("the store changed: %d tokens in %d shards, was %d in %d", m2.Tokens, len(m2.Shards), m1.Tokens, len(m1.Shards))
	}

	// Fixed, the corrupt file is new content: it is read and appended.
	os.WriteFile(corrupt, whole, 0o644)
	rep = run(filepath.Join(dir, "*.jsonl.zst"))
	if rep.Appended != 1 || len(rep.SkippedFiles) != 0 {
		t.Fatalf("after the fix: %+v; want the fixed file appended", rep)
	}
	m3, _ := tokens.ReadManifest(storeDir)
	text := decodeStore(t, testTokenizer(t), storeDir, m3)
	if n := strings.Count(text, "late line "); n != 200 {
		t.Fatalf("the store holds %d lines of the fixed file, want 200", n)
	}
	if n := strings.Count(text, "file 0 line 7:"); n != 1 {
		t.Fatalf("a line of f0 is in the store %d times, want once", n)
	}
}
