package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/worker"
)

// trainSmall learns a small vocabulary for a command test.
func trainSmall(t *testing.T, text string) []byte {
	t.Helper()
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(text)}, tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func envValue(env []string, key string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v
		}
	}
	return ""
}

// The default request queues one sampling task per dataset of the plan's
// mixture, each with its weight's part of 2GB.
func TestEnqueueTokenizerQueuesOneSampleTaskPerDataset(t *testing.T) {
	r := testsvc.StartRedis(t)
	env := append(baseEnv(t), "KILN_REDIS_URL="+r.URL(0))
	out, errOut, code := sched(t, env, "enqueue", "tokenizer", "code-16k")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if n := len(regexp.MustCompile(`queued tokenizer:sample:\S+ on ingest`).FindAllString(out, -1)); n != 3 {
		t.Fatalf("%d tasks queued, want 3:\n%s", n, out)
	}
	if !strings.Contains(out, "tokenizers/code-16k/tokenizer.json") {
		t.Fatalf("output does not say where the tokenizer lands:\n%s", out)
	}
	opt, _ := asynq.ParseRedisURI(r.URL(0))
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	pending, err := insp.ListPendingTasks(scheduler.QueueIngest)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, ti := range pending {
		a, err := scheduler.Decode[scheduler.TokenizerSample](ti.Payload)
		if err != nil {
			t.Fatal(err)
		}
		if a.VocabSize != 16384 || a.TotalBytes != 2e9 || len(a.Mixture) != 3 || a.Previous != scheduler.DefaultTokenizer || a.Seed != 1 {
			t.Fatalf("payload %+v", a)
		}
		// Each carries its dataset's preset, as resolved here.
		if a.Preset == nil || a.Preset.Name != a.Dataset || a.Preset.Repo == "" || len(a.Preset.Include) == 0 {
			t.Fatalf("the task of %s carries the preset %+v", a.Dataset, a.Preset)
		}
		got[a.Dataset] = a.Bytes
	}
	if got["the-stack-v2"] != 1.4e9 || got["fineweb-edu"] != 4e8 || got["proof-pile-2"] != 2e8 {
		t.Fatalf("budgets %v", got)
	}
	// The same request again finds the queued tasks.
	out, _, code = sched(t, env, "enqueue", "tokenizer", "code-16k")
	if code != 0 || strings.Count(out, "already queued as tokenizer:sample:") != 3 || strings.Contains(out, "queued tokenizer:sample") {
		t.Fatalf("re-enqueue: exit %d\n%s", code, out)
	}
	// Another request for the name being made (another vocabulary, size or
	// seed) is refused, naming the work under way; nothing more is queued.
	for _, args := range [][]string{{"--vocab", "8192"}, {"--sample", "1GB"}, {"--seed", "2"}} {
		out, errOut, code := sched(t, env, append([]string{"enqueue", "tokenizer", "code-16k"}, args...)...)
		if code != 2 || !strings.Contains(errOut, `tokenizer "code-16k" is being made by another request (tokenizer:sample:`) {
			t.Errorf("%v while code-16k is being made: exit %d, %q %q", args, code, out, errOut)
		}
	}
	if pending, _ := insp.ListPendingTasks(scheduler.QueueIngest); len(pending) != 3 {
		t.Errorf("%d sample tasks queued, want the first request's 3", len(pending))
	}
	// A tokenizer being made can be the one another is compared with.
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "code-8k", "--vocab", "8192", "--previous", "code-16k"); code != 0 {
		t.Errorf("--previous naming a tokenizer being made: exit %d, %q %q", code, out, errOut)
	}

	// The samples drawn, the last queued the training, as a worker's does:
	// the same request again is that training, already queued, and queues
	// no sample again; another is refused, naming the training.
	q := scheduler.NewClient(opt)
	defer q.Close()
	a, err := scheduler.Decode[scheduler.TokenizerSample](pending[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range pending {
		if err := insp.DeleteTask(scheduler.QueueIngest, ti.ID); err != nil {
			t.Fatal(err)
		}
	}
	train, err := q.Enqueue(context.Background(), worker.TokenizerTrainTask(a))
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, env, "enqueue", "tokenizer", "code-16k")
	if code != 0 || !strings.Contains(out, "tokenizer:train is already queued as "+train.ID+"; nothing queued") {
		t.Errorf("the same request while its training is queued: exit %d\n%s%s", code, out, errOut)
	}
	pending, _ = insp.ListPendingTasks(scheduler.QueueIngest)
	for _, ti := range pending {
		if a, err := scheduler.Decode[scheduler.TokenizerSample](ti.Payload); err != nil || a.Name != "code-8k" {
			t.Errorf("the same request while its training is queued queued %s (%+v); want nothing", ti.ID, a)
		}
	}
	if _, errOut, code := sched(t, env, "enqueue", "tokenizer", "code-16k", "--seed", "2"); code != 2 || !strings.Contains(errOut, "is being made by another request ("+train.ID) {
		t.Errorf("another request while code-16k's training is queued: exit %d, %q", code, errOut)
	}
}

// Each bad request exits 2 with one line naming what to fix, and queues
// nothing.
func TestEnqueueTokenizerRefusals(t *testing.T) {
	r := testsvc.StartRedis(t)
	env := append(baseEnv(t), "KILN_REDIS_URL="+r.URL(0))
	taken := trainSmall(t, "some words for a tokenizer that exists")
	dir := filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "taken")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), taken, 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"a/b"}, `tokenizer name "a/b"`},
		{[]string{"t", "--vocab", "100"}, "--vocab 100: give a vocabulary of 258"},
		{[]string{"t", "--sample", "lots"}, `--sample: size "lots" is not a number of bytes`},
		// A unit left off: 257 ids would be published under the name.
		{[]string{"t", "--sample", "100"}, "--sample 100 is too little text for 16384 ids: each merge is learnt from pairs seen many times over, and a tokenizer that falls short is published anyway, its name taken for good; give at least 256.0 KiB"},
		{[]string{"t", "--vocab", "4096", "--sample", "60KB"}, "--sample 60KB is too little text for 4096 ids"},
		{[]string{"t", "--from", "the-stack-v2"}, `--from: mixture "the-stack-v2": "the-stack-v2" is not dataset=weight`},
		// --from's own mistake, not a --sample too small for the vocab.
		{[]string{"t", "--from", "local:/src/*.go=0", "--sample", "100KB"}, `--from: `},
		{[]string{"t", "--from", "local:/src/*.go", "--sample", "100KB"}, `is not dataset=weight`},
		{[]string{"t", "--from", "the-stack-v2=0.5,nope=0.5"}, `--from: unknown dataset "nope"`},
		{[]string{"t", "--from", "fineweb-edu=1,proof-pile-2=1e-12", "--sample", "1MB"}, "proof-pile-2's weight 1e-12 of --sample 1MB is no bytes at all"},
		{[]string{"taken"}, `tokenizer "taken" already exists (`},
		{[]string{"t", "--previous", "nosuch"}, `--previous "nosuch": no tokenizer of that name to compare with (known: taken)`},
		{[]string{"t", "u"}, "one tokenizer name"},
	} {
		_, errOut, code := sched(t, env, append([]string{"enqueue", "tokenizer"}, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q on one line", c.args, code, errOut, c.want)
		}
	}
	opt, _ := asynq.ParseRedisURI(r.URL(0))
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	if ts, _ := insp.ListPendingTasks(scheduler.QueueIngest); len(ts) != 0 {
		t.Fatalf("refused requests queued %d tasks", len(ts))
	}
}

// writeStore makes a one-shard token store with the tokenizer tj.
func writeStore(t *testing.T, dir string, tj []byte) {
	t.Helper()
	tok, err := tokenizer.Parse(tj)
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	app, err := tokens.OpenAppender(context.Background(), dir, tokens.Tokenizer{Name: "t", SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	var buf bytes.Buffer
	for _, id := range append(tok.Encode("a document"), eos) {
		binary.Write(&buf, binary.LittleEndian, uint16(id))
	}
	if _, err := app.Append(context.Background(), tokens.ShardInfo{ID: "s"}, &buf); err != nil {
		t.Fatal(err)
	}
}

// A dataset of --presets' file is queued with its preset, which the worker
// then reads without a copy of the file; one the file does not name is
// refused before anything is queued.
func TestEnqueueTokenizerCarriesThePresetsFile(t *testing.T) {
	r := testsvc.StartRedis(t)
	env := append(baseEnv(t), "KILN_REDIS_URL="+r.URL(0))
	presets := filepath.Join(t.TempDir(), "presets.yaml")
	os.WriteFile(presets, []byte("mine:\n  repo: org/mine\n  revision: v2\n  include: [\"data/*.jsonl\"]\n  columns: {text: body}\n"), 0o644)
	if _, errOut, code := sched(t, env, "enqueue", "tokenizer", "mine-1k", "--from", "mine=1", "--vocab", "1024"); code != 2 || !strings.Contains(errOut, `unknown dataset "mine"`) {
		t.Fatalf("without --presets: exit %d, %q", code, errOut)
	}
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "mine-1k", "--from", "mine=1", "--vocab", "1024", "--presets", presets); code != 0 {
		t.Fatalf("with --presets: exit %d\n%s%s", code, out, errOut)
	}
	opt, _ := asynq.ParseRedisURI(r.URL(0))
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	pending, err := insp.ListPendingTasks(scheduler.QueueIngest)
	if err != nil || len(pending) != 1 {
		t.Fatalf("%d tasks pending (%v), want 1", len(pending), err)
	}
	a, err := scheduler.Decode[scheduler.TokenizerSample](pending[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	if p := a.Preset; p == nil || p.Name != "mine" || p.Repo != "org/mine" || p.Revision != "v2" || p.Columns.Text != "body" || !slices.Equal(p.Include, []string{"data/*.jsonl"}) {
		t.Fatalf("the task carries %+v", a.Preset)
	}
}
