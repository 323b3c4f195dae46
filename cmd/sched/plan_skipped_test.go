package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A file the demo's store records as skipped, by an earlier demo, is
// counted as skipped, for the reason recorded, as sched ingest --direct
// counts it, not as already there: the second demo over the same files
// said every file was there, the one holding none of its text among them.
func TestTheDemoCountsAFileSkippedBeforeAsSkipped(t *testing.T) {
	dir, corpus := t.TempDir(), t.TempDir()
	srcs, err := filepath.Glob(filepath.Join(runtime.GOROOT(), "src", "net", "http", "*.go"))
	if err != nil || len(srcs) == 0 {
		t.Fatalf("no files in GOROOT/src/net/http: %v", err)
	}
	for _, p := range srcs {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(corpus, filepath.Base(p)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Not UTF-8: skipped whole, and recorded so in the store.
	if err := os.WriteFile(filepath.Join(corpus, "bin.txt"), []byte{0xff, 0xfe, 0x81, 0x80}, 0o644); err != nil {
		t.Fatal(err)
	}
	o := demoDirOptions(dir, filepath.Join(corpus, "*"))
	o.MaxTokens = 10_000_000 // all of it: the second demo plans every file again
	for run, want := range []string{
		fmt.Sprintf("    %d files appended this time, 0 already there; the store holds ", len(srcs)),
		fmt.Sprintf("    0 files appended this time, %d already there; the store holds ", len(srcs)),
	} {
		var out bytes.Buffer
		if _, err := runDemo(context.Background(), &out, o); err != nil {
			t.Fatalf("demo %d: %v\n%s", run+1, err, out.String())
		}
		if !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "tokens\n    skipped files: invalid-utf8=1") {
			t.Errorf("demo %d says\n%s\nwant %q and the file not UTF-8 skipped", run+1, out.String(), want)
		}
		if earlier := "(1 of them recorded as skipped in the store by an earlier run, which this one passed over: a local file is read again once it changes)"; (run == 1) != strings.Contains(out.String(), earlier) {
			t.Errorf("demo %d says\n%s\nwant %q on the second alone", run+1, out.String(), earlier)
		}
	}
}
