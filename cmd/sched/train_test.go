package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

// trainTestTokenizer writes a small learned tokenizer.json and returns
// its path and SHA-256, the identity a store made by it records.
func trainTestTokenizer(t *testing.T, text string) (path, sha string) {
	t.Helper()
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat(text, 50))}, tokenizer.TrainOptions{VocabSize: 280})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "tokenizer.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path, tk.SHA256()
}

func trainTestStore(t *testing.T, vocab, n int) string {
	return trainTestStoreBy(t, strings.Repeat("cd", 32), vocab, n)
}

// trainTestStoreBy writes a store of n ids that records tokenizer sha.
func trainTestStoreBy(t *testing.T, sha string, vocab, n int) string {
	t.Helper()
	return trainTestStoreNamed(t, "test", sha, vocab, n)
}

// trainTestStoreNamed writes a store of n ids that records tokenizer name
// and sha.
func trainTestStoreNamed(t *testing.T, name, sha string, vocab, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	a, err := tokens.OpenAppender(context.Background(), dir, tokens.Tokenizer{Name: name, SHA256: sha, VocabSize: vocab}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ids := make([]uint32, n)
	for i := range ids[:n-1] {
		ids[i] = uint32(1 + (i*7919)%(vocab-1))
	}
	if _, err := a.Append(context.Background(), tokens.ShardInfo{ID: "s0"}, bytes.NewReader(tokens.Encode(nil, tokens.DtypeFor(vocab), ids))); err != nil {
		t.Fatal(err)
	}
	return dir
}

func runTrainCmd(args ...string) (string, error) {
	// A fresh command each time: cobra keeps flag values between runs.
	c := newTrainCmd()
	var out lockedBuffer
	c.SetOut(&out)
	c.SetErr(&out)
	c.SetArgs(args[1:])
	err := c.ExecuteContext(context.Background())
	return out.String(), err
}

// lockedBuffer holds a command's standard output and its log in one: the
// training goroutine prints its steps while the checkpoint writer's logs
// (os.Stdout and os.Stderr, where a process writes them, are files of
// their own).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestTrainCommandTrainsAndResumes(t *testing.T) {
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"train", "--model", "tiny", "--tokens", store + "=1", "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--steps", "2", "--log-every", "1", "--out", out, "--tokenizer-file", tokJSON}
	text, err := runTrainCmd(args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if !strings.Contains(text, "step 1/2  loss ") || !strings.Contains(text, "checkpoint "+filepath.Join(out, "step-0000002")) {
		t.Errorf("output:\n%s", text)
	}
	if _, err := os.Stat(filepath.Join(out, "step-0000002", trainer.TokenizerFile)); err != nil {
		t.Errorf("checkpoint has no tokenizer.json: %v", err)
	}
	// Resuming with a longer run continues from step 2.
	args[len(args)-7] = "3" // --steps
	text, err = runTrainCmd(append(args, "--resume")...)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if strings.Contains(text, "step 1/3") || !strings.Contains(text, "step 3/3") {
		t.Errorf("resumed run did not continue at step 3:\n%s", text)
	}
	// Each call left a TensorBoard event file of its own steps.
	events, _ := filepath.Glob(filepath.Join(out, results.TensorBoardDir, "events.out.tfevents.*"))
	if len(events) != 2 || !strings.HasSuffix(events[0], ".step0") || !strings.HasSuffix(events[1], ".step2") {
		t.Errorf("event files %v; want one from step 0 and one from the resume", events)
	}
	// The same command without --resume (another seed here) would start
	// afresh over the run's checkpoints: refused, nothing touched.
	before := dirDigest(t, out)
	// (Without --tokenizer-file, whose absence it would warn of first.)
	fresh := append(slices.Clone(args[:len(args)-2]), "--seed", "9")
	text, err = runTrainCmd(fresh...)
	if code := exitCode(err); code != exitBadInput || !strings.Contains(err.Error(), out+" already holds a run's checkpoints (the newest step-0000003)") ||
		!strings.Contains(err.Error(), "--resume") {
		t.Errorf("a fresh run into %s: exit %d, %v\n%s", out, code, err, text)
	}
	// Refused before it says a word (a log line of its tokenizer): the
	// error is the one line (here cobra's print of it, and its usage).
	if !strings.HasPrefix(text, "Error: "+out+" already holds") {
		t.Errorf("a fresh run into %s wrote before its refusal:\n%s", out, text)
	}
	if after := dirDigest(t, out); after != before {
		t.Errorf("the refused run changed %s:\n%s\nbecame\n%s", out, before, after)
	}
}

// dirDigest is every file under dir with its size and SHA-256, one a line.
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %x\n", p, len(data), sha256.Sum256(data))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestTrainCommandBadInput(t *testing.T) {
	store := trainTestStore(t, 4096, 50000)
	// A tokenizer other than the one the store records: its ids would
	// mean other text.
	otherTok, _ := trainTestTokenizer(t, "a completely different corpus of prose and numbers 1 2 3\n")
	short := trainTestStore(t, 4096, 10)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"train", "--steps", "1"}, "--tokens"},
		{[]string{"train", "--steps", "1", "--tokens", store + "=x"}, "weight"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--model", "huge"}, "unknown model"},
		{[]string{"train", "--steps", "1", "--tokens", short, "--seq", "32"}, short},
		{[]string{"train", "--steps", "1", "--tokens", store, "--run-config", "/absent.yaml"}, "/absent.yaml"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--seq", "32", "--tokenizer-file", otherTok}, "but this work's ids are made by tokenizer"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--seq", "32", "--tokenizer-file", otherTok}, "their ids mean different text; give the store's tokenizer (--tokenizer "},
		{[]string{"train", "--steps", "1", "--tokens", store, "--seq", "32", "--tokenizer-file", otherTok}, "or --tokenizer-file with its tokenizer.json)"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--moe", "experts=1"}, "moe.experts must be at least 2"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--moe", "experts=4,top_k=5"}, "top_k"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--gpus", "two"}, `--gpus "two": give a number of GPUs`},
		{[]string{"train", "--steps", "1", "--tokens", store, "--gpus", "2", "--accumulate", "3", "--engine", "cuda"}, "accumulate 3 is not a multiple of gpus 2"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--gpus", "2", "--accumulate", "2", "--engine", "cpu"}, "needs the cuda engine"},
		{[]string{"train", "--steps", "2", "--total-tokens", "100", "--tokens", store}, "--steps 2 and --total-tokens 100 both give the run's length"},
		{[]string{"train", "--steps", "1", "--tokens", store, "--tokens", store}, "named twice"},
	} {
		_, err := runTrainCmd(tc.args...)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: want a bad-input error containing %q, got %v", tc.args, tc.want, err)
		}
	}
}

// A run resumed at or past its length trains nothing, and says so.
func TestTrainResumedPastItsLengthSaysSo(t *testing.T) {
	t.Parallel()
	_, args := trainedRun(t)
	out, errOut, code := sched(t, nil, append(args, "--steps", "1", "--resume")...)
	if code != 0 || !strings.Contains(out, "the run is at step 2 of its 1 already: nothing to train") {
		t.Fatalf("resumed at step 2 of 1: exit %d\n%s%s", code, out, errOut)
	}
}

// The global --tokenizer names a published tokenizer for train too; a file
// given to it, or a run's YAML given to the global --config, is refused
// naming the flag that takes it.
func TestTrainTokenizerByNameAndMistakenFlags(t *testing.T) {
	t.Parallel()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	data := t.TempDir()
	b, _ := os.ReadFile(tokJSON)
	os.MkdirAll(filepath.Join(data, "tokenizers", "fox"), 0o755)
	os.WriteFile(filepath.Join(data, "tokenizers", "fox", "tokenizer.json"), b, 0o644)
	env := []string{"KILN_DATA_DIR=" + data}
	run := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(run, []byte("model: tiny\nseq: 32\nbatch: 2\ntotal_steps: 1\n"), 0o644)
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"train", "--tokens", store, "--engine", "cpu", "--precision", "fp32", "--out", out}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", run}, "--run-config " + run},
		{[]string{"--run-config", run, "--tokenizer", tokJSON}, "--tokenizer-file " + tokJSON},
		{[]string{"--run-config", run, "--tokenizer", "fox", "--tokenizer-file", tokJSON}, "not both"},
		{[]string{"--run-config", run, "--tokenizer", "wolf"}, `tokenizer "wolf" is not known`},
	} {
		_, errOut, code := sched(t, env, append(args, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line with %q", c.args, code, errOut, c.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("a refused train wrote %s", out)
	}
	stdout, errOut, code := sched(t, env, append(args, "--run-config", run, "--tokenizer", "fox")...)
	if code != 0 {
		t.Fatalf("train --tokenizer fox: exit %d\n%s%s", code, stdout, errOut)
	}
	got, err := os.ReadFile(filepath.Join(out, "step-0000001", trainer.TokenizerFile))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("the checkpoint's tokenizer.json is not the published fox (%v)", err)
	}
}

// --moe trains Mixtral's sparse block on the CPU engine and the checkpoint
// is a MixtralForCausalLM with every expert's tensors.
func TestTrainCommandWithExperts(t *testing.T) {
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	text, err := runTrainCmd("train", "--model", "tiny", "--moe", "experts=4,top_k=2,d_ff=64", "--tokens", store+"=1", "--engine", "cpu",
		"--precision", "fp32", "--seq", "32", "--batch", "2", "--steps", "2", "--log-every", "1", "--out", out, "--tokenizer-file", tokJSON)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	cfg, err := os.ReadFile(filepath.Join(out, "step-0000002", trainer.ConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"MixtralForCausalLM"`, `"num_local_experts": 4`, `"num_experts_per_tok": 2`, `"intermediate_size": 64`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config.json lacks %s:\n%s", want, cfg)
		}
	}
	// Each logged step carries the router's load-balancing loss.
	mf, err := os.ReadFile(filepath.Join(out, trainer.MetricsFile))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(mf), `"aux_loss":`); n != 2 {
		t.Errorf("metrics.jsonl has %d lines with aux_loss, want 2:\n%s", n, mf)
	}
	// Resumed without --moe, or with other experts: refused, naming both
	// feed-forwards, before any step.
	for _, moe := range [][]string{nil, {"--moe", "experts=8,top_k=2,d_ff=64"}} {
		args := append([]string{"train", "--model", "tiny", "--tokens", store + "=1", "--engine", "cpu", "--precision", "fp32", "--seq", "32",
			"--batch", "2", "--steps", "4", "--log-every", "1", "--out", out, "--tokenizer-file", tokJSON, "--resume"}, moe...)
		text, err := runTrainCmd(args...)
		if code := exitCode(err); code != exitBadInput || !strings.Contains(err.Error(), "d_ff 64 (4 experts, top 2)") ||
			!strings.Contains(err.Error(), "give the run the model it was trained with") {
			t.Errorf("resume with %v: exit %d, %v\n%s", moe, code, err, text)
		}
	}
}

// A run stopped by Ctrl-C or SIGTERM says where it stopped, which
// checkpoint it wrote and how to go on, and exits 130 (not a failure's 1);
// the same command with --resume continues from there to the end.
func TestTrainCommandStoppedSaysWhereAndHowToGoOn(t *testing.T) {
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"--model", "tiny", "--tokens", store + "=1", "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--steps", "40", "--log-every", "1", "--out", out, "--tokenizer-file", tokJSON}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := &cancelOn{mark: "step 3/40", cancel: cancel}
	c := newTrainCmd()
	c.SetOut(w)
	c.SetErr(io.Discard)
	c.SetArgs(args)
	err := c.ExecuteContext(ctx)
	if code := exitCode(err); code != exitInterrupted {
		t.Fatalf("stopped run: exit code %d (%v), want %d\n%s", code, err, exitInterrupted, w.buf.String())
	}
	var ie interruptedError
	if !errors.As(err, &ie) {
		t.Fatalf("stopped run: %v", err)
	}
	msg := err.Error()
	ck := ""
	for _, s := range []int{3, 4} {
		if strings.Contains(msg, fmt.Sprintf("at step %d of 40, checkpoint %s", s, filepath.Join(out, trainer.StepDir(s)))) {
			ck = filepath.Join(out, trainer.StepDir(s))
		}
	}
	if ck == "" || !strings.Contains(msg, "--resume") {
		t.Fatalf("%q does not name the step, its checkpoint and --resume", msg)
	}
	if _, err := trainer.CheckCheckpoint(ck); err != nil {
		t.Fatalf("the checkpoint the message names: %v", err)
	}
	text, err := runTrainCmd(append([]string{"train"}, append(args, "--resume")...)...)
	if err != nil || !strings.Contains(text, "step 40/40") || strings.Contains(text, "step 1/40") {
		t.Fatalf("resumed: %v\n%s", err, text)
	}
}

// With no tokenizer named, a checkpoint carries the one the token stores
// were made by when this machine's catalog holds it under the name their
// manifests record, with their SHA-256: before, it held none (KILN_TOKENIZER
// was not read either) and 'sched generate' could not use it. A catalog
// tokenizer of that name but other contents is not taken.
func TestTrainCarriesTheStoresTokenizer(t *testing.T) {
	t.Parallel()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	b, _ := os.ReadFile(tokJSON)
	other, _ := trainTestTokenizer(t, "lorem ipsum dolor sit amet, consectetur adipiscing elit\n")
	ob, _ := os.ReadFile(other)
	run := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(run, []byte("model: tiny\nseq: 32\nbatch: 2\ntotal_steps: 1\n"), 0o644)
	for _, c := range []struct {
		catalog []byte
		want    []byte
		warn    string
	}{
		{b, b, ""},
		{ob, nil, "is not the one the stores were made by"},
		{nil, nil, "is in neither"},
	} {
		data := t.TempDir()
		if c.catalog != nil {
			os.MkdirAll(filepath.Join(data, "tokenizers", "fox"), 0o755)
			os.WriteFile(filepath.Join(data, "tokenizers", "fox", "tokenizer.json"), c.catalog, 0o644)
		}
		store := trainTestStoreNamed(t, "fox", sha, 4096, 50000)
		out := filepath.Join(t.TempDir(), "run")
		stdout, errOut, code := sched(t, []string{"KILN_DATA_DIR=" + data, "KILN_REDIS_URL=redis://127.0.0.1:1/0"},
			"train", "--tokens", store, "--engine", "cpu", "--precision", "fp32", "--out", out, "--run-config", run)
		if code != 0 {
			t.Fatalf("train: exit %d\n%s%s", code, stdout, errOut)
		}
		got, err := os.ReadFile(filepath.Join(out, "step-0000001", trainer.TokenizerFile))
		switch {
		case c.want != nil && (err != nil || !bytes.Equal(got, c.want)):
			t.Errorf("the checkpoint does not carry the stores' tokenizer (%v)\n%s", err, errOut)
		case c.want == nil && err == nil:
			t.Errorf("warn %q: the checkpoint carries a tokenizer.json", c.warn)
		case c.want == nil && !strings.Contains(errOut, c.warn):
			t.Errorf("no warning with %q:\n%s", c.warn, errOut)
		}
	}
}

// sched train logs in KILN_LOG_FORMAT's format (--log-format), as the
// worker does; it wrote JSON to any pipe whatever was asked.
func TestTrainLogsInTheConfiguredFormat(t *testing.T) {
	t.Parallel()
	store := trainTestStore(t, 4096, 50000)
	run := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(run, []byte("model: tiny\nseq: 32\nbatch: 2\ntotal_steps: 1\n"), 0o644)
	for _, format := range []string{"console", "json"} {
		out := filepath.Join(t.TempDir(), "run")
		stdout, errOut, code := sched(t, []string{"KILN_LOG_FORMAT=" + format},
			"train", "--tokens", store, "--engine", "cpu", "--precision", "fp32", "--out", out, "--run-config", run)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", format, code, stdout, errOut)
		}
		line := strings.SplitN(strings.TrimSpace(errOut), "\n", 2)[0]
		if json := strings.HasPrefix(line, "{"); json != (format == "json") || line == "" {
			t.Errorf("KILN_LOG_FORMAT=%s: the log's first line is %q", format, line)
		}
	}
	if _, errOut, code := sched(t, nil, "train", "--tokens", store, "--engine", "cpu", "--run-config", run, "--out", t.TempDir()+"/x", "--log-format", "xml"); code != 2 || !strings.Contains(errOut, "xml") {
		t.Errorf("--log-format xml: exit %d, %q", code, errOut)
	}
}

// onMark runs then once, in the Write of the first output that holds
// mark, the writer's goroutine held there until it returns.
type onMark struct {
	mark string
	then func()
	buf  bytes.Buffer
	done bool
}

func (w *onMark) Write(p []byte) (int, error) {
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.mark) {
		w.done = true
		w.then()
	}
	return len(p), nil
}

// A second `sched train` into the --out of one that trains is refused,
// exit 2, naming the directory and the process: the two wrote each
// other's checkpoints and metrics, and removed each other's checkpoints
// under way as stale. The first trains on; once it ended, the directory is
// free again.
func TestTrainIntoADirectoryInUseIsRefused(t *testing.T) {
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"--model", "tiny", "--tokens", store + "=1", "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--log-every", "1", "--out", out, "--tokenizer-file", tokJSON}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var second string
	var secondErr error
	w := &onMark{mark: "step 3/40", then: func() {
		// The first is held in its step 3's line, its directory locked.
		second, secondErr = runTrainCmd(append([]string{"train"}, append(args, "--steps", "20")...)...)
		cancel()
	}}
	c := newTrainCmd()
	c.SetOut(w)
	c.SetErr(io.Discard)
	c.SetArgs(append(args, "--steps", "40", "--checkpoint-every", "40"))
	err := c.ExecuteContext(ctx)
	if code := exitCode(err); code != exitInterrupted {
		t.Fatalf("the first run: exit code %d (%v), want %d, stopped after the second\n%s", code, err, exitInterrupted, w.buf.String())
	}
	want := fmt.Sprintf("run directory %s is being trained into by another process (pid %d): wait for it to end or stop it, or train into another directory (--out)", out, os.Getpid())
	if code := exitCode(secondErr); code != 2 || secondErr == nil || secondErr.Error() != want || strings.Contains(second, "step 1/20") {
		t.Fatalf("the second run: exit code %d, %v\n%s\nwant exit 2 and %q, nothing trained", code, secondErr, second, want)
	}
	// The first kept its checkpoint of the stop step; the directory is
	// free once it ended.
	text, err := runTrainCmd(append([]string{"train"}, append(args, "--steps", "40", "--resume")...)...)
	if err != nil || strings.Contains(text, "step 1/40") || !strings.Contains(text, "step 40/40") {
		t.Fatalf("resumed: %v\n%s", err, text)
	}
}

// A store's name given to --tokens, as a run of the queue names it, is
// read as a path from here; where the data directory holds the store of
// that name, the refusal names its path, where it said to ingest into a
// store that exists.
func TestTrainTokensNamingAStoreOfTheDataDirectory(t *testing.T) {
	t.Parallel()
	env := baseEnv(t)
	data := envValue(env, "KILN_DATA_DIR")
	named := filepath.Join(data, "tokens", "mystore")
	if err := os.CopyFS(named, os.DirFS(trainTestStore(t, 4096, 50000))); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, env, "token store mystore: mystore here has no manifest.json; the token store of that name in the data directory is "+named+": give its path",
		"train", "--tokens", "mystore", "--model", "tiny", "--steps", "2", "--engine", "cpu", "--seq", "32", "--batch", "2", "--out", filepath.Join(t.TempDir(), "run"))
}
