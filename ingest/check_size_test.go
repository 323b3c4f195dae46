package ingest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A local JSON lines file whose one line is over the size a line may hold
// is refused by the check with a remedy of size (the limit, and to split
// the document or the file), where it said to check the field or column
// the text is in, which no other would mend; a file whose records are
// skipped for other reasons besides keeps that remedy, with the size one.
func TestCheckOfALineTooLargeSaysToSplitIt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A line of MaxLineBytes+1 zero bytes, sparse on disk: its size
	// alone skips it, before it would be read as JSON.
	line := filepath.Join(dir, "big", "big.jsonl")
	if err := os.MkdirAll(filepath.Dir(line), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(line)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("\n"), MaxLineBytes+1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// The same line after one whose text field is null.
	mixed := filepath.Join(dir, "mixed", "mixed.jsonl")
	if err := os.MkdirAll(filepath.Dir(mixed), 0o755); err != nil {
		t.Fatal(err)
	}
	if f, err = os.Create(mixed); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"text":null}` + "\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("\n"), MaxLineBytes+int64(len(`{"text":null}`+"\n"))+1); err != nil {
		t.Fatal(err)
	}
	f.Close()

	size := "over the 64 MiB one JSON line may hold is skipped as too large (a fixed limit that bounds memory): split such documents into smaller ones, or the file into lines of less"
	column := `check the field or column the text is in ("text")`
	for _, c := range []struct {
		path, skips string
		column      bool
	}{
		{line, "(too-large=1)", false},
		{mixed, "(empty-document=1, too-large=1)", true},
	} {
		_, err := Check(context.Background(), Preset{Name: "local:" + c.path, Glob: c.path}, nil)
		var pe *PresetError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "gave no document, every record skipped "+c.skips) || !strings.Contains(err.Error(), size) ||
			strings.Contains(err.Error(), column) != c.column {
			t.Errorf("check of %s: %v; want a preset error saying %s, with the size remedy (%q) and the column one only where other records were skipped",
				filepath.Base(c.path), err, c.skips, size)
		}
	}
}
