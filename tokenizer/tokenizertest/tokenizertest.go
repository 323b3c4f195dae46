// Package tokenizertest gives tests in any package the golden files of
// tokenizer/testdata: the two tokenizer.json files made by Hugging Face
// tokenizers, and the Go, Python and English texts they were checked on.
package tokenizertest

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Dir is the absolute path of tokenizer/testdata.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "testdata")
}

// File returns tokenizer/testdata/name, gunzipped when name ends in .gz.
func File(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(name, ".gz") {
		return b
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// Text returns a golden text ("go", "python" or "english").
func Text(t testing.TB, name string) string {
	t.Helper()
	return string(File(t, name+".txt.gz"))
}

// Tokenizer returns a golden tokenizer.json ("gpt2-style" or "gpt4-style").
func Tokenizer(t testing.TB, style string) []byte {
	t.Helper()
	return File(t, style+".tokenizer.json.gz")
}

// Documents cuts text into documents of about n bytes, each ending at a
// line end, as datasets store code and prose.
func Documents(text string, n int) []string {
	var out []string
	for len(text) > 0 {
		cut := min(n, len(text))
		if i := strings.IndexByte(text[cut:], '\n'); i >= 0 {
			cut += i + 1
		} else {
			cut = len(text)
		}
		out = append(out, text[:cut])
		text = text[cut:]
	}
	return out
}
