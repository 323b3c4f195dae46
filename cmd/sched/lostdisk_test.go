package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// operations.md's lost disk, as a user meets it: the appending worker's
// token store is gone, the worker is started again on the empty disk, and
// the same `sched enqueue ingest` fills the store again, file for file.
// The worker's start is what makes the store's status in object storage
// say the disk holds nothing: without it the plan takes every file for
// stored.
func TestTheSameIngestRefillsAStoreWhoseDiskWasLost(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	data := filepath.Join(t.TempDir(), "data")
	corpus := filepath.Join(runtime.GOROOT(), "src", "strings")
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + corpus, "KILN_TOKENIZER=code-300", "KILN_LOG_FORMAT=json"}
	tj, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("func (b *Builder) String() string { return b.s }\n", 200))},
		tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	putObject(t, data, "tokenizers/code-300/tokenizer.json", tj)
	w := &dayWorker{t: t, env: append(baseEnv(t), env...), args: []string{"--queues", "ingest=1,append=1"}}
	w.start()

	filesDone := regexp.MustCompile(`(?m)^code \(local:.*\)  files (\d+)/(\d+) done`)
	idle := regexp.MustCompile(`(?m)^(ingest|append) +0 +0 +0 `)
	ingestAll := func(when string) *tokens.Manifest {
		t.Helper()
		if out, errOut, code := sched(t, env, "enqueue", "ingest", "local:"+filepath.Join(corpus, "*.go"), "--store", "code"); code != 0 {
			t.Fatalf("%s: enqueue ingest: exit %d %s%s", when, code, out, errOut)
		}
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			out, _, _ := sched(t, env, "status")
			// Every file done, and nothing queued or running on either queue.
			if m := filesDone.FindStringSubmatch(out); m != nil && m[1] != "0" && m[1] == m[2] && len(idle.FindAllString(out, -1)) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the ingest did not finish:\n%s\nworker log:\n%s", when, out, w.log())
			}
		}
		m, err := tokens.ReadManifest(filepath.Join(data, "tokens", "code"))
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		return m
	}
	first := ingestAll("first ingest")

	if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.cmd.Wait()
	if err := os.RemoveAll(filepath.Join(data, "tokens", "code")); err != nil {
		t.Fatal(err)
	}
	w.start()
	said := regexp.MustCompile(`"store":"code","files_listed":[1-9][0-9]*,"files_held":0`)
	for deadline := time.Now().Add(3 * time.Minute); !said.MatchString(w.log()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker started on the empty disk did not say the status of store code listed what it lacks:\n%s", w.log())
		}
	}
	again := ingestAll("the same ingest after the disk was lost")
	if len(again.Shards) != len(first.Shards) || again.Tokens != first.Tokens || again.Documents != first.Documents {
		t.Fatalf("the store filled again holds %d shards, %d documents, %d tokens; it held %d, %d, %d",
			len(again.Shards), again.Documents, again.Tokens, len(first.Shards), first.Documents, first.Tokens)
	}
}
