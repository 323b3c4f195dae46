package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// queuedSegment enqueues `sched enqueue train <args>` and returns the
// payload the GPU worker will decode.
func queuedSegment(t *testing.T, env []string, url string, args ...string) scheduler.TrainSegment {
	t.Helper()
	out, errOut, code := sched(t, env, append([]string{"enqueue", "train"}, args...)...)
	m := regexp.MustCompile(`queued (train:segment:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue train %v: exit %d, %q %q", args, code, out, errOut)
	}
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		t.Fatal(err)
	}
	in := asynq.NewInspector(opt)
	defer in.Close()
	info, err := in.GetTaskInfo(scheduler.QueueGPU, m[1])
	if err != nil {
		t.Fatal(err)
	}
	var env1 struct {
		Args scheduler.TrainSegment `json:"args"`
	}
	if err := json.Unmarshal(info.Payload, &env1); err != nil {
		t.Fatalf("payload %q: %v", info.Payload, err)
	}
	return env1.Args
}

// putObject writes an object into the local object store of data.
func putObject(t *testing.T, data, key string, b []byte) {
	t.Helper()
	p := filepath.Join(data, "objects", filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantBadInput runs sched and wants exit 2 with one line matching re.
func wantBadInput(t *testing.T, env []string, re string, args ...string) {
	t.Helper()
	out, errOut, code := sched(t, env, args...)
	if code != exitBadInput || !regexp.MustCompile(re).MatchString(errOut) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("sched %v: exit %d, stdout %q, stderr %q; want exit 2 and one line matching %s", args, code, out, errOut, re)
	}
}

// The README's order is enforced at enqueue: a run is refused, naming the
// command to run first, until its tokenizer and stores exist or are being
// made; then it is queued, with the run's own tokenizer unless
// --tokenizer pins another, and once. A tokenizer larger than the model's
// vocabulary, and a store too small to hold out an evaluation window, are
// refused too; nothing is queued by a refusal.
func TestEnqueueTrainChecksTheRunFirst(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	home := t.TempDir()
	data := filepath.Join(home, "data")
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data}

	wantBadInput(t, env, `run pilot trains with tokenizer mix-16384, which does not exist yet: make it first with 'sched enqueue tokenizer mix-16384' \(the small model's vocab_size`,
		"enqueue", "train", "pilot")
	// A run of a smaller model is told the vocabulary to ask for: the
	// default, 16384 ids, would make a tokenizer it could never use.
	wantBadInput(t, env, `run pilot-cpu trains with tokenizer mix-4096, which does not exist yet: make it first with 'sched enqueue tokenizer mix-4096 --vocab 4096' \(the tiny model's vocab_size`,
		"enqueue", "train", "pilot-cpu")
	// The demo run's tokenizer and store are made from this machine's Go
	// sources, as sched demo makes them, where the hints sampled the
	// pilot's datasets from the Hub and named no dataset for the store.
	goFiles := regexp.QuoteMeta("local:" + filepath.Join(runtime.GOROOT(), "src", "*", "*.go"))
	wantBadInput(t, env, `run demo trains with tokenizer go-4096, which does not exist yet: make it first with 'sched enqueue tokenizer go-4096 --vocab 4096 --from "`+goFiles+`=1" --sample 3MB' \(the tiny model's vocab_size`,
		"enqueue", "train", "demo")
	// Asked for more ids than the run's model holds, it is refused while
	// it is being made, where the segment waited for it and then failed.
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "big"); code != 0 {
		t.Fatalf("enqueue tokenizer big: exit %d %q %q", code, out, errOut)
	}
	wantBadInput(t, env, `run pilot-cpu: tokenizer big, being made \(task tokenizer:sample:[0-9a-f]+\), was asked for 16384 ids but the tiny model's vocab_size is 4096: the run could never use it`,
		"enqueue", "train", "pilot-cpu", "--tokenizer", "big")
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "mix-4096", "--vocab", "4096"); code != 0 {
		t.Fatalf("enqueue tokenizer mix-4096: exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "mix-16384"); code != 0 {
		t.Fatalf("enqueue tokenizer: exit %d %q %q", code, out, errOut)
	}
	wantBadInput(t, env, `run pilot trains on token store the-stack-v2, which holds no tokens and which no ingest is filling: run 'sched enqueue ingest the-stack-v2' first`,
		"enqueue", "train", "pilot")
	wantBadInput(t, env, `run demo trains on token store go-stdlib, .*: run 'sched enqueue ingest "`+goFiles+`" --store go-stdlib --tokenizer mix-4096 --max-tokens 3M' first`,
		"enqueue", "train", "demo", "--tokenizer", "mix-4096")
	for _, ds := range []string{"the-stack-v2", "fineweb-edu", "proof-pile-2"} {
		if out, errOut, code := sched(t, env, "enqueue", "ingest", ds); code != 0 {
			t.Fatalf("enqueue ingest %s: exit %d %q %q", ds, code, out, errOut)
		}
	}
	if a := queuedSegment(t, env, r.URL(0), "pilot"); a.Run != "pilot" || a.Tokenizer != "" || a.Engine != "" {
		t.Fatalf("enqueue train pilot queued %+v; want run pilot with the run's own tokenizer and engine", a)
	}
	out, _, code := sched(t, env, "enqueue", "train", "pilot")
	if code != 0 || !strings.Contains(out, "run pilot is already queued as train:segment:") {
		t.Fatalf("second enqueue train pilot: exit %d, %q; want it reported as already queued", code, out)
	}
	wantBadInput(t, env, `unknown run "pilott": choose one of .*pilot`, "enqueue", "train", "pilott")
	wantBadInput(t, env, `unknown flag: --store`, "enqueue", "train", "pilot", "--store", "x")
	wantBadInput(t, env, `--engine "tpu": use cuda, cpu or auto`, "enqueue", "train", "pilot", "--engine", "tpu")

	// A tokenizer of 30093 ids for the tiny model's 4096.
	gz, err := os.ReadFile("../../tokenizer/testdata/gpt2-style.tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	big, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	putObject(t, data, "tokenizers/big/tokenizer.json", big)
	wantBadInput(t, env, `run demo: tokenizer big has 30093 ids but the tiny model's vocab_size is 4096`, "enqueue", "train", "demo", "--tokenizer", "big")

	// A store of 1000 tokens cannot hold out a window of 65.
	small, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("func main() { return nil }\n", 200))},
		tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	putObject(t, data, "tokenizers/tiny-300/tokenizer.json", small)
	putObject(t, data, "tokens/few/status.json", []byte(`{"tokens": 1000, "documents": 3, "shards": 1}`))
	runsFile := filepath.Join(home, "runs.yaml")
	if err := os.WriteFile(runsFile, []byte("r:\n  from: demo\n  tokenizer: tiny-300\n  mixture: [{store: few, weight: 1}]\nr0:\n  from: r\n  eval_every: 0\nhuge:\n  from: r0\n  batch: 100000000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	renv := append(env, "KILN_RUNS="+runsFile)
	// Its sizes are the run's fields, not flags: the advice says where.
	wantBadInput(t, renv, `run huge: batch 100000000 x seq 64 .* needs .* but the largest card kiln supports .* has 139.00 GiB available: `+
		`in a runs file \(KILN_RUNS, here and on the GPU worker\), give run huge a smaller batch and a larger accumulate \(the same tokens a step\), or a smaller seq\s*$`,
		"enqueue", "train", "huge")
	wantBadInput(t, renv, `run r: its token stores hold at most 1000 tokens, too few for one evaluation window .*set eval_every: 0`, "enqueue", "train", "r")
	if a := queuedSegment(t, renv, r.URL(0), "r0"); a.Run != "r0" {
		t.Fatalf("enqueue train r0 queued %+v", a)
	}
	// demo's 64-token windows: the first held out is window 3615 (a hash
	// of the index picks 1 in 1000), so 100,000 tokens (1,538 windows) had
	// passed a check of 1,000 windows and failed at the worker's first
	// evaluation; 3,616 windows are 235,040 tokens.
	putObject(t, data, "tokens/go-stdlib/status.json", []byte(`{"tokens": 235039, "documents": 30, "shards": 3}`))
	wantBadInput(t, renv, `run demo: its token stores hold at most 235039 tokens, too few for one evaluation window .*the first of them at window 3615, so a store needs 235040 tokens`, "enqueue", "train", "demo", "--tokenizer", "tiny-300")
	putObject(t, data, "tokens/go-stdlib/status.json", []byte(`{"tokens": 235040, "documents": 30, "shards": 3}`))
	if a := queuedSegment(t, renv, r.URL(0), "demo", "--tokenizer", "tiny-300"); a.Tokenizer != "tiny-300" {
		t.Fatalf("enqueue train demo --tokenizer tiny-300 queued tokenizer %q; want tiny-300 pinned", a.Tokenizer)
	}
}

// An ingest is refused at enqueue, naming the command to run first, while
// its tokenizer neither exists nor is being made, and nothing is queued;
// once the tokenizer is queued, the same ingest is queued (to wait for it
// on the worker).
func TestEnqueueIngestChecksItsTokenizerFirst(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	wantBadInput(t, env, `^sched: the ingest would tokenize with tokenizer mix-16384, which does not exist yet: make it first with 'sched enqueue tokenizer mix-16384', or name an existing one with --tokenizer`,
		"enqueue", "ingest", "fineweb-edu")
	wantBadInput(t, env, `tokenizer mine, which does not exist yet: make it first with 'sched enqueue tokenizer mine'`,
		"enqueue", "ingest", "fineweb-edu", "--tokenizer", "mine")
	// A tokenizer a run trains with is asked for with its model's
	// vocabulary: published under the name with another, it could never
	// serve the run.
	wantBadInput(t, env, `tokenizer mix-4096, which does not exist yet: make it first with 'sched enqueue tokenizer mix-4096 --vocab 4096' \(the vocabulary of the model of run pilot-cpu, which trains with it\), or name`,
		"enqueue", "ingest", "fineweb-edu", "--tokenizer", "mix-4096")
	if out, errOut, code := sched(t, env, "runs"); code != 0 || strings.Contains(out, "ingest:plan") {
		t.Fatalf("sched runs after the refusals: exit %d: %s%s; want nothing queued", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "mix-16384"); code != 0 {
		t.Fatalf("enqueue tokenizer: exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "enqueue", "ingest", "fineweb-edu"); code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Fatalf("enqueue ingest fineweb-edu while its tokenizer is being made: exit %d: %s%s; want it queued", code, out, errOut)
	}
}

// A name longer than store.MaxNameBytes (a tokenizer's, a token store's, a
// run's) is refused at the command, naming the limit, where it was queued
// and failed on the worker's filesystem.
func TestOverLongNamesAreRefused(t *testing.T) {
	t.Parallel()
	env := []string{"KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0", "KILN_DATA_DIR=" + t.TempDir()}
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("package main\n"), 0o644)
	long := strings.Repeat("z", store.MaxNameBytes+1)
	for _, args := range [][]string{
		{"enqueue", "tokenizer", long, "--from", "local:" + src + "/*.txt=1", "--vocab", "1024"},
		{"enqueue", "train", long},
		{"ingest", "local:" + src + "/*.txt", "--direct", "--store", long},
	} {
		out, errOut, code := sched(t, env, args...)
		if code != 2 || !strings.Contains(errOut, fmt.Sprintf("is %d bytes long: use at most %d", len(long), store.MaxNameBytes)) {
			t.Errorf("sched %s %s: exit %d, %q %q", args[0], args[1], code, out, errOut)
		}
	}
	if out, _, _ := sched(t, env, "runs"); strings.Contains(out, "zzzz") {
		t.Errorf("something was queued:\n%s", out)
	}
}
