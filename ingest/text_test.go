package ingest

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
	if docs, skips, err := readAll(t, big, OpenOptions{Name: "big.txt.zst"}); err != nil || len(docs) != 0 || skips.String() != "too-large=1" {
		t.Errorf("a .txt.zst of %d bytes decompressed read as %d documents (skipped %v), %v; want it skipped as too-large", MaxTextFileBytes+1, len(docs), skips, err)
	}
}
