package ingest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A local glob whose matches are all links to a device is refused naming
// one and what it is, and saying that only regular files are read, where
// it said that no files match; a FIFO beside a file of text is passed
// over, and the ingest's report names it and what it is, where it was
// passed over without a word.
func TestAGlobOfFilesThatAreNotRegularSaysWhatTheyAre(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dev := filepath.Join(dir, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.jsonl", "b.jsonl"} {
		if err := os.Symlink("/dev/zero", filepath.Join(dev, n)); err != nil {
			t.Fatal(err)
		}
	}
	glob := filepath.Join(dev, "*")
	_, err := Plan(context.Background(), Preset{Name: LocalPrefix + glob, Glob: glob}, nil, 0)
	var pe *PresetError
	want := fmt.Sprintf("matches no regular file (%s is a symbolic link to /dev/zero, a character device, and 1 more that are not regular files): only regular files are read", filepath.Join(dev, "a.jsonl"))
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), want) {
		t.Fatalf("a glob of links to /dev/zero: %v; want a preset error saying %q", err, want)
	}

	if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "src", "a.jsonl"), []byte(`{"text":"package main"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "src", "pipe.jsonl")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Direct(context.Background(), skipsDirect(t, dir, nil))
	if err != nil || rep.Files != 1 || rep.Appended != 1 || len(rep.NotRegular) != 1 ||
		rep.NotRegular[0].String() != fifo+" is a FIFO (named pipe)" {
		t.Fatalf("an ingest of a file of text and a FIFO: %+v, %v; want the file appended and the FIFO named as passed over", rep, err)
	}
}
