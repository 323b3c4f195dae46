package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/ingest"
)

// A file that a direct ingest skipped is recorded so in its store, and the
// same ingest again passes over it unread: it reports the file as skipped,
// for the reason recorded, and not as already in the store, and it exits
// as the first run did. Into a store that holds other files' tokens, a
// dataset of nothing but that file is an ingest of no text (exit 2) each
// time, where the second run said "1 already in the store" and exited 0;
// a dataset where it is one of several is ingested (exit 0), the file
// still called skipped.
func TestAFileSkippedBeforeIsReportedAsSkippedNotAsInTheStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	mkdir := func(name string) string {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	write := func(path string, b []byte) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ingestInto := func(glob string) (string, string, int) {
		t.Helper()
		return sched(t, nil, "ingest", "local:"+glob, "--direct", "--store", "base", "--tokenizer", "tk", "--data-dir", data)
	}

	// The store holds other files' tokens.
	other := mkdir("other")
	write(filepath.Join(other, "a.go"), []byte("package main\nfunc f() {}\n"))
	if out, errOut, code := ingestInto(filepath.Join(other, "*")); code != 0 || !strings.Contains(out, "1 appended") {
		t.Fatalf("ingest of a file of text: exit %d\n%s%s", code, out, errOut)
	}

	// A text file over the 64 MiB a text file may hold (sparse: its
	// size alone skips it).
	big := mkdir("big")
	f, err := os.Create(filepath.Join(big, "bomb.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(ingest.MaxTextFileBytes + 1); err != nil {
		t.Fatal(err)
	}
	f.Close()
	noText := "none of its 1 files holds text to ingest (skipped: too-large=1"
	for run := range 2 {
		out, errOut, code := ingestInto(filepath.Join(big, "*"))
		if code != exitBadInput || !strings.Contains(errOut, noText) || !strings.Contains(errOut, "the first: "+filepath.Join(big, "bomb.txt")+": skipped (too-large)") {
			t.Fatalf("run %d of an ingest whose one file is too large: exit %d\n%s%s\nwant exit 2 and %q, the file and its reason named", run+1, code, out, errOut, noText)
		}
		if !strings.Contains(out, "0 already in the store\nskipped files: too-large=1") {
			t.Fatalf("run %d of an ingest whose one file is too large says\n%s\nwant 0 already in the store and the file skipped", run+1, out)
		}
		if earlier := "1 of them recorded as skipped in the store by an earlier run"; (run == 1) != strings.Contains(out, earlier) {
			t.Fatalf("run %d says\n%s\nwant %q on the second run alone", run+1, out, earlier)
		}
	}

	// One file skipped among others that are ingested.
	mixed := mkdir("mixed")
	write(filepath.Join(mixed, "b.go"), []byte("package main\nfunc g() {}\n"))
	write(filepath.Join(mixed, "bin.txt"), []byte{0xff, 0xfe, 0x00, 0x81})
	for run, want := range []string{
		"2 files, 1 appended (1 documents, ",
		"2 files, 0 appended (0 documents, 0 tokens), 1 already in the store\nskipped files: invalid-utf8=1 (1 of them recorded as skipped in the store by an earlier run",
	} {
		out, errOut, code := ingestInto(filepath.Join(mixed, "*"))
		if code != 0 || !strings.Contains(out, want) || !strings.Contains(out, "skipped files: invalid-utf8=1") {
			t.Fatalf("run %d of an ingest of a file of text and one skipped: exit %d\n%s%s\nwant exit 0 and %q", run+1, code, out, errOut, want)
		}
	}
}

// A direct ingest's summary names the matches of its glob passed over for
// not being regular files, where a FIFO beside a file of text went
// unsaid; a glob of nothing but links to a device is refused (exit 2)
// naming one and what it is, where it said that no files match.
func TestADirectIngestNamesTheMatchesThatAreNotRegularFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	src := filepath.Join(dir, "src")
	dev := filepath.Join(dir, "dev")
	for _, d := range []string{src, dev} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "a.go"), []byte("package main\nfunc f() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(src, "pipe.go")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(dev, "zero.go")); err != nil {
		t.Fatal(err)
	}
	ingestOf := func(glob string) (string, string, int) {
		return sched(t, nil, "ingest", "local:"+glob, "--direct", "--store-dir", filepath.Join(dir, "store"), "--tokenizer-file", tok)
	}
	out, errOut, code := ingestOf(filepath.Join(src, "*"))
	if want := "passed over: 1 of the glob's matches, not regular files (" + fifo + " is a FIFO (named pipe)): only regular files are read\n"; code != 0 ||
		!strings.Contains(out, "1 files, 1 appended") || !strings.Contains(out, want) {
		t.Fatalf("ingest of a file of text and a FIFO: exit %d\n%s%s\nwant %q", code, out, errOut, want)
	}
	_, errOut, code = ingestOf(filepath.Join(dev, "*"))
	if want := filepath.Join(dev, "zero.go") + " is a symbolic link to /dev/zero, a character device): only regular files are read"; code != exitBadInput || !strings.Contains(errOut, want) {
		t.Fatalf("ingest of a link to /dev/zero: exit %d\n%s\nwant exit 2 and %q", code, errOut, want)
	}
}
