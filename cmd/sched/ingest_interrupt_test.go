package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/tokens"
)

// sched ingest --direct stopped by Ctrl-C once it has appended a file says
// what it kept and how to go on, and exits 130 as sched train and sched
// demo do, where it said "context canceled" and exited 1; the same command
// again appends the rest, and the store then holds every file once.
func TestADirectIngestStoppedSaysWhatItKept(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	// Enough files that work is left when the first append is logged.
	const files = 400
	for f := range files {
		var b strings.Builder
		for d := range 200 {
			fmt.Fprintf(&b, "file %d line %d: the quick brown fox jumps over the lazy dog\n", f, d)
		}
		if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%03d.txt", f)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	store := filepath.Join(dir, "store")
	args := []string{"ingest", "local:" + filepath.Join(src, "*.txt"), "--direct", "--store-dir", store, "--tokenizer-file", tok}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(baseEnv(t), "KILN_LOG_FORMAT=json")
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var said []string
	lines := bufio.NewScanner(errPipe)
	for lines.Scan() {
		said = append(said, lines.Text())
		if strings.Contains(lines.Text(), `"shard appended"`) {
			if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	for lines.Scan() {
		said = append(said, lines.Text())
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted {
		t.Fatalf("ingest --direct stopped by SIGINT: %v; want exit %d\n%s", err, exitInterrupted, strings.Join(said, "\n"))
	}
	last := said[len(said)-1]
	if want := "the files appended to " + store + " so far are kept, and the same command again goes on with the rest"; !strings.Contains(last, "ingest stopped") || !strings.Contains(last, want) {
		t.Fatalf("its last line %q; want it to say the ingest stopped and %q", last, want)
	}

	out, errOut, code := sched(t, nil, args...)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d files, ", files)) {
		t.Fatalf("the same command again: exit %d\n%s%s", code, out, errOut)
	}
	m, err := tokens.ReadManifest(store)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Shards) != files {
		t.Fatalf("the store holds %d shards after the second run; want the %d files once each", len(m.Shards), files)
	}
}

// Stopped before its first append (here as its first download waits on
// the Hub), a direct ingest says that nothing was written to its store,
// which is not there: not that the files appended so far are kept.
func TestADirectIngestStoppedBeforeItsFirstAppendSaysNothingWasWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	type textRow struct {
		Text string `parquet:"text"`
	}
	hub.Add("HuggingFaceFW/fineweb-edu", "sample/100BT/000_00000.parquet", writeParquet(t, []textRow{{"a lesson in a sentence"}}), true)
	asked := make(chan struct{})
	var once sync.Once
	hub.SetBeforeResolve(func(ctx context.Context, repo, path string) error {
		once.Do(func() { close(asked) })
		<-ctx.Done()
		return ctx.Err()
	})
	store := filepath.Join(dir, "store")
	cmd := exec.Command(os.Args[0], "ingest", "fineweb-edu", "--direct", "--store-dir", store, "--tokenizer-file", tok)
	cmd.Env = append(baseEnv(t), "HF_ENDPOINT="+hub.Server.URL)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-asked:
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("the ingest did not ask the Hub for its file: %s", errOut.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	want := "before its first append: nothing was written to " + store + ", and the same command again starts it"
	if !errors.As(err, &ee) || ee.ExitCode() != exitInterrupted || !strings.Contains(errOut.String(), want) || strings.Contains(errOut.String(), "so far are kept") {
		t.Fatalf("ingest --direct stopped before its first append: %v, %q; want exit %d and %q", err, errOut.String(), exitInterrupted, want)
	}
	if _, err := os.Stat(filepath.Join(store, tokens.ManifestFile)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a store at %s (%v); want none", store, err)
	}
}
