package ingest

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// A text file kept compressed (a corpus as .txt.gz, a source file or a
// config compressed in a tree) is one document of the text it decompresses
// to, where its compressed bytes were skipped as invalid-utf8. An archive
// (.tar.gz, or a .gz holding one) is skipped; a stream cut short is a
// corrupt file; one that decompresses past MaxTextFileBytes is too large,
// read no further than that.
func TestACompressedTextFileIsReadAsTheTextItHolds(t *testing.T) {
	dir := t.TempDir()
	body := "package main\n\nfunc main() { println(\"héllo\") }\n"
	for _, name := range []string{"corpus.txt.gz", "main.go.zst", "README.md.gz", "notes.zst"} {
		path := writeAs(t, filepath.Join(dir, name), body)
		docs, skips, err := readAll(t, path, OpenOptions{Name: name})
		if err != nil || !slices.Equal(texts(docs), []string{body}) || len(skips) != 0 {
			t.Errorf("%s read as %q (skipped %v), %v; want its text, one document", name, texts(docs), skips, err)
		}
	}

	// A tar archive, by its name or not, is skipped by its first header:
	// its padding and headers are valid UTF-8.
	var tarred bytes.Buffer
	tw := tar.NewWriter(&tarred)
	tw.WriteHeader(&tar.Header{Name: "main.go", Mode: 0o644, Size: int64(len(body))})
	tw.Write([]byte(body))
	tw.Close()
	for _, name := range []string{"src.tar.gz", "src.tar.zst", "src.gz"} {
		archive := writeAs(t, filepath.Join(dir, name), tarred.String())
		var skip *SkipError
		if docs, _, err := readAll(t, archive, OpenOptions{Name: name}); !errors.As(err, &skip) || skip.Reason != SkipArchive || len(docs) != 0 {
			t.Errorf("%s read as %d documents, %v; want the file skipped as an archive", name, len(docs), err)
		}
	}

	whole := compressedAs(t, "x.gz", []byte(strings.Repeat(body, 1000)))
	cut := filepath.Join(dir, "cut.txt.gz")
	if err := os.WriteFile(cut, whole[:len(whole)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	var skip *SkipError
	if docs, _, err := readAll(t, cut, OpenOptions{Name: "cut.txt.gz"}); !errors.As(err, &skip) || skip.Reason != SkipCorruptFile || len(docs) != 0 {
		t.Errorf("a .txt.gz cut short read as %d documents, %v; want the file skipped as corrupt-file", len(docs), err)
	}

	big := writeAs(t, filepath.Join(dir, "big.txt.zst"), strings.Repeat("a", MaxTextFileBytes+1))
	if docs, _, err := readAll(t, big, OpenOptions{Name: "big.txt.zst"}); !errors.As(err, &skip) || skip.Reason != SkipTooLarge || len(docs) != 0 {
		t.Errorf("a .txt.zst of %d bytes decompressed read as %d documents, %v; want the file skipped as too-large", MaxTextFileBytes+1, len(docs), err)
	}
}

// A text file is its one document, so a document skipped skips the file
// for the document's own reason, too-large or invalid-utf8, where it was
// an empty-file of "no usable documents (skipped: too-large=1)"; the
// message names the file, the reason and what to do.
func TestATextFileWhoseDocumentIsSkippedIsSkippedForItsReason(t *testing.T) {
	dir := t.TempDir()
	latin1 := "caf\xe9 cr\xe8me\n" // Latin-1, not UTF-8
	for _, c := range []struct {
		name, body string
		reason     string
		says       []string
	}{
		{"big.txt", strings.Repeat("a", MaxTextFileBytes+1), SkipTooLarge, []string{"big.txt: skipped (too-large): ", "67108865 bytes", "64 MiB", "split it"}},
		{"big.txt.gz", strings.Repeat("a", MaxTextFileBytes+1), SkipTooLarge, []string{"big.txt.gz: skipped (too-large): ", "decompresses to over the 64 MiB", "split it"}},
		{"notes.txt", latin1, SkipInvalidUTF8, []string{"notes.txt: skipped (invalid-utf8): ", "not UTF-8", "convert it to UTF-8"}},
		{"notes.txt.zst", latin1, SkipInvalidUTF8, []string{"notes.txt.zst: skipped (invalid-utf8): ", "not UTF-8", "convert it to UTF-8"}},
		{"logo.png", "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff", SkipInvalidUTF8, []string{"logo.png: skipped (invalid-utf8): "}},
	} {
		path := writeAs(t, filepath.Join(dir, c.name), c.body)
		docs, skips, err := readAll(t, path, OpenOptions{Name: c.name})
		var skip *SkipError
		if !errors.As(err, &skip) || skip.Reason != c.reason || len(docs) != 0 || len(skips) != 0 {
			t.Errorf("%s read as %d documents (skipped %v), %v; want the file skipped as %s", c.name, len(docs), skips, err, c.reason)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s skipped: %q; want it to say %q", c.name, err, s)
			}
		}
	}
}

// Through the queue's steps, a text file of a hub dataset whose document is
// skipped is recorded (its AppendJob, then the store's record of it) as
// skipped for that document's reason; a JSON lines file whose every line is
// skipped holds several documents and stays an empty-file with their
// counts.
func TestAQueuedTextFileIsRecordedAsSkippedForItsDocumentsReason(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, h := newCorpus(t, map[string]*tokenizer.Tokenizer{"t": testTokenizer(t)})
	h.Add(corpusRepo, "data/a.parquet", parquetBytes(t, []textRow{{Text: "func main() {}"}}), true)
	h.Add(corpusRepo, "data/notes.txt", []byte("caf\xe9\n"), false)
	h.Add(corpusRepo, "data/big.txt.zst", compressedAs(t, "big.txt.zst", bytes.Repeat([]byte("a"), MaxTextFileBytes+1)), true)
	h.Add(corpusRepo, "data/bad.jsonl", []byte("{\"text\":\"\xff\"}\n{\"text\":\"\"}\n"), false)
	plan, err := p.Plan(ctx, PlanJob{Dataset: "corpus", Store: "code", Tokenizer: "t", Seed: 3})
	if err != nil || len(plan.Shards) != 4 {
		t.Fatalf("plan: %+v, %v", plan, err)
	}
	want := map[string]struct{ reason, says string }{
		"data/a.parquet":   {"", ""},
		"data/notes.txt":   {SkipInvalidUTF8, "data/notes.txt: skipped (invalid-utf8): it is not UTF-8 text"},
		"data/big.txt.zst": {SkipTooLarge, "data/big.txt.zst: skipped (too-large): it decompresses to over the 64 MiB"},
		"data/bad.jsonl":   {SkipEmptyFile, "data/bad.jsonl: skipped (empty-file): no usable documents (skipped: empty-document=1, invalid-utf8=1)"},
	}
	for _, j := range plan.Shards {
		out, _, err := p.Shard(ctx, j, nil)
		w := want[j.Path]
		if err != nil || out.SkipReason != w.reason || !strings.HasPrefix(out.SkipMessage, w.says) {
			t.Errorf("shard of %s: skipped as %q (%q), %v; want %q (%q)", j.Path, out.SkipReason, out.SkipMessage, err, w.reason, w.says)
			continue
		}
		if res, err := p.Append(ctx, out, nil); err != nil || res.Skipped != (w.reason != "") {
			t.Fatalf("append of %s: %+v, %v", j.Path, res, err)
		}
	}
	m, err := tokens.ReadManifest(filepath.Join(p.StoresDir, "code"))
	if err != nil || len(m.Shards) != 1 {
		t.Fatalf("store: %+v, %v; want a.parquet's shard", m, err)
	}
	recorded := map[string]string{}
	for _, s := range m.Skipped {
		recorded[s.Source] = s.Reason
	}
	for path, w := range want {
		if w.reason != "" && !strings.HasPrefix(recorded[path], w.reason+": "+w.says) {
			t.Errorf("the store records %s as skipped for %q; want %q", path, recorded[path], w.reason+": "+w.says)
		}
	}
}
