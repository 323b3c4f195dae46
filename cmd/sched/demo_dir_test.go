package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// demoDirOptions are the short runs of the other demo tests, on files.
func demoDirOptions(dir, files string) demoOptions {
	return demoOptions{Dir: dir, Files: files, Duration: 2 * time.Second, Engine: "cpu",
		TokenizerBytes: 256 << 10, MaxTokens: 300_000, MinSteps: 10, Quiet: true}
}

// checkDemoDir fails t unless everything in dir agrees with its
// tokenizer.json: every copy of the tokenizer (published, the catalog's
// local copy, the checkpoints') is the same bytes, and the token store
// records that tokenizer.
func checkDemoDir(t *testing.T, dir string) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join(dir, demoTokenizerFile))
	if err != nil {
		t.Fatalf("the demo's tokenizer: %v", err)
	}
	sum := sha256.Sum256(want)
	wantSHA := hex.EncodeToString(sum[:])
	copies := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != catalog.FileName {
			return err
		}
		copies++
		if b, err := os.ReadFile(p); err != nil || !bytes.Equal(b, want) {
			t.Errorf("%s differs from %s (%v)", p, demoTokenizerFile, err)
		}
		return nil
	})
	if err != nil || copies < 3 {
		t.Errorf("%d copies of the tokenizer in %s (%v), want it, the published one and the checkpoints'", copies, dir, err)
	}
	m, err := tokens.ReadManifest(filepath.Join(dir, "tokens", demoStore))
	if err != nil {
		t.Fatal(err)
	}
	if m.Tokenizer.Name != demoTokenizer || m.Tokenizer.SHA256 != wantSHA || m.Tokenizer.VocabSize != demoVocab {
		t.Errorf("the store records tokenizer %+v, want %s of sha256 %s and %d ids", m.Tokenizer, demoTokenizer, wantSHA, demoVocab)
	}
	// What 'sched tokenizers' and a worker see of the dir.
	objects, err := store.NewLocal(filepath.Join(dir, "objects"))
	if err != nil {
		t.Fatal(err)
	}
	if e, _, err := catalog.New(objects, dir).Resolve(context.Background(), demoTokenizer); err != nil || e.SHA256 != wantSHA {
		t.Errorf("the catalog of %s resolves %s to %+v, %v", dir, demoTokenizer, e, err)
	}
}

// A corpus too small for the demo's tokenizer is refused, naming --files
// and what to give it, before anything is put in --dir; the demo with a
// corpus of the usual size then runs in that --dir.
func TestDemoDirAfterATooSmallCorpus(t *testing.T) {
	dir, small := t.TempDir(), t.TempDir()
	// 40 KB in four files: 88 KB of /etc/*.conf gave a tokenizer of 2092
	// ids.
	srcs, err := filepath.Glob(filepath.Join(runtime.GOROOT(), "src", "strings", "*.go"))
	if err != nil || len(srcs) < 4 {
		t.Fatalf("%d files in GOROOT/src/strings: %v", len(srcs), err)
	}
	for i, p := range srcs[:4] {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(small, fmt.Sprintf("%d.txt", i)), b[:min(len(b), 10<<10)], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := demoDirOptions(dir, filepath.Join(small, "*.txt"))
	var out bytes.Buffer
	_, err = runDemo(context.Background(), &out, o)
	if code := exitCode(err); code != exitBadInput || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("--files %q", o.Files)) ||
		!strings.Contains(fmt.Sprint(err), "more or larger text files") {
		t.Errorf("demo of a small corpus: exit %d, %v; want exit 2 naming --files and asking for more text\n%s", code, err, out.String())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the refused demo wrote %d entries into --dir", len(entries))
	}

	o.Files = filepath.Join(runtime.GOROOT(), "src", "*", "*.go")
	out.Reset()
	if _, err := runDemo(context.Background(), &out, o); err != nil {
		t.Fatalf("the demo after a small corpus: %v\n%s", err, out.String())
	}
	checkDemoDir(t, dir)
}

// A demo over other files than the last in its --dir learns their
// tokenizer and replaces the store, rather than tokenizing them with, and
// appending them to, the other corpus's; and a --dir whose store was made
// with another tokenizer than its tokenizer.json (as an earlier release
// left it after a small corpus) is put right.
func TestDemoDirOtherFilesStartAfresh(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(runtime.GOROOT(), "src")
	o := demoDirOptions(dir, filepath.Join(src, "*", "*.go"))
	var out bytes.Buffer
	if _, err := runDemo(context.Background(), &out, o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	first, err := os.ReadFile(filepath.Join(dir, demoTokenizerFile))
	if err != nil {
		t.Fatal(err)
	}

	o.Files = filepath.Join(src, "net", "http", "*.go")
	out.Reset()
	if _, err := runDemo(context.Background(), &out, o); err != nil {
		t.Fatalf("the demo on other files: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "learning a new tokenizer") || !strings.Contains(out.String(), "replacing the token store") {
		t.Errorf("the demo on other files does not say it starts afresh:\n%s", out.String())
	}
	checkDemoDir(t, dir)
	m, err := tokens.ReadManifest(filepath.Join(dir, "tokens", demoStore))
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range m.Shards {
		if filepath.Dir(sh.Source) != filepath.Join(src, "net", "http") {
			t.Fatalf("the store of %s holds %s", o.Files, sh.Source)
		}
	}

	// A tokenizer.json of 4096 ids that the store was not made with, and no
	// corpus.json.
	if err := os.WriteFile(filepath.Join(dir, demoTokenizerFile), first, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, demoCorpusFile)); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if _, err := runDemo(context.Background(), &out, o); err != nil {
		t.Fatalf("the demo in a --dir whose store has another tokenizer: %v\n%s", err, out.String())
	}
	checkDemoDir(t, dir)
}

// The demo's refusals say what its user can do: give --files more text.
// Neither names a setting of 'sched train' nor the queue's own wording.
func TestDemoCorpusMessages(t *testing.T) {
	t.Parallel()
	err := checkEvalWindows("small/*.go", 3, 54_864, 64)
	for _, want := range []string{`--files "small/*.go"`, "54864 tokens", "more or larger text files"} {
		if exitCode(err) != exitBadInput || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("store too short to evaluate on: exit %d, %v; want exit 2 and %q", exitCode(err), err, want)
		}
	}
	if err := checkEvalWindows("big/*.go", 3, 3_000_000, 64); err != nil {
		t.Errorf("a store of 3M tokens: %v", err)
	}
	if got := taskReason("train:segment: run demo: bad (skip retry for the task)"); got != "train:segment: run demo: bad" {
		t.Errorf("taskReason: %q", got)
	}
}

// Where the GOROOT this sched knows holds no sources (a binary built with
// -trimpath, or one copied to another machine), the demo learns from the
// Go installation the go command names; where there is none either, it
// says so and what to give, where it said --files "src/*/*.go" matched
// nothing though no --files was given.
func TestDemoFindsTheGoSourcesOrSaysWhatToGive(t *testing.T) {
	t.Setenv("GOROOT", filepath.Join(t.TempDir(), "no-go"))
	root := goRoot()
	if _, err := os.Stat(filepath.Join(root, "src", "fmt", "print.go")); err != nil {
		t.Fatalf("goRoot with GOROOT naming no Go: %q, which holds no Go sources (%v); want the go command's", root, err)
	}
	wantRefused(t, []string{"GOROOT=" + filepath.Join(t.TempDir(), "no-go"), "PATH=" + t.TempDir()},
		"sched demo learns from the Go standard library's sources, and finds no Go installation here (GOROOT is unset or holds no src, this sched was built without one, and there is no go command): set GOROOT to a Go installation, or give --files a glob of text files",
		"demo", "--dir", t.TempDir())
}

// The demo's engine auto says why it trains on the CPU where no GPU
// starts, as every other command of the engine does (on a GPU host it
// names the cuda engine instead).
func TestDemoSaysWhyAutoChoseTheCPU(t *testing.T) {
	r, err := runs.Presets().Get(demoRun)
	if err != nil {
		t.Fatal(err)
	}
	r.Engine = "auto"
	var said []string
	_, engine, err := calibrate(context.Background(), r.RunConfig, func(s string) { said = append(said, s) })
	if err != nil {
		t.Fatal(err)
	}
	if engine == "cpu" && (len(said) == 0 || !strings.HasPrefix(said[0], "engine auto: using the CPU: ")) {
		t.Errorf("engine auto trained on the CPU and said %q; want why", said)
	}
}

// A --files that matches directories names them and the glob of their
// files, before a tokenizer is learned from nothing; directories among
// files are passed over.
func TestDemoFilesThatAreDirectoriesAreNamed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := sched(t, nil, "demo", "--dir", filepath.Join(dir, "demo"), "--files", src)
	if code != exitBadInput || out != "" || errOut != fmt.Sprintf("sched: --files %q matches only directories (%s): name their files with a glob, such as '%s'\n", src, src, filepath.Join(src, "*")) {
		t.Errorf("demo --files DIR: exit %d, stdout %q, stderr %q; want exit 2 naming the directory and its glob, nothing begun", code, out, errOut)
	}
	if err := os.MkdirAll(filepath.Join(dir, "src2"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = sched(t, nil, "demo", "--dir", filepath.Join(dir, "demo"), "--files", filepath.Join(dir, "src*"))
	if code != exitBadInput || !strings.Contains(errOut, "matches only directories ("+src+" and 1 more)") {
		t.Errorf("demo --files of two directories: exit %d, %q; want both counted", code, errOut)
	}
	// A file beside the directory is the corpus: the refusal is its
	// own (too little text), not the directories'.
	if err := os.WriteFile(filepath.Join(src, "a.go"), []byte("package a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code = sched(t, nil, "demo", "--dir", filepath.Join(dir, "demo"), "--files", filepath.Join(src, "*"))
	if code != exitBadInput || strings.Contains(errOut, "directories") || !strings.Contains(errOut, "its 1 file(s)") {
		t.Errorf("demo --files of a file and a directory: exit %d, %q; want the one file read", code, errOut)
	}
}
