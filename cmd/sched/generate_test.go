package main

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// makeCheckpoint writes a small randomly initialised model with the golden
// GPT-2-style tokenizer (30093 tokens) as a checkpoint directory.
func makeCheckpoint(t *testing.T) (string, model.Config) {
	t.Helper()
	dir := t.TempDir()
	gz, err := os.Open(filepath.Join("..", "..", "tokenizer", "testdata", "gpt2-style.tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer gz.Close()
	zr, err := gzip.NewReader(gz)
	if err != nil {
		t.Fatal(err)
	}
	tj, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tj, 0o644); err != nil {
		t.Fatal(err)
	}
	c := model.Config{VocabSize: 30093, Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Intermediate: 64,
		MaxPositions: 256, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: true, BOSTokenID: 1, EOSTokenID: 0, InitializerRange: 0.5}
	if err := model.WriteConfig(filepath.Join(dir, "config.json"), c); err != nil {
		t.Fatal(err)
	}
	if err := model.SaveParams(filepath.Join(dir, "model.safetensors"), model.InitParams(c, 5), model.F32); err != nil {
		t.Fatal(err)
	}
	return dir, c
}

// The command prints the prompt and the continuation the engine generates
// for the prompt's token ids, decoded by the checkpoint's tokenizer.
func TestGenerateCommand(t *testing.T) {
	dir, c := makeCheckpoint(t)
	prompt := "func main() {"
	out, errOut, code := runModelCLI(t, "generate", "--checkpoint", dir, "--prompt", prompt, "--max-tokens", "6",
		"--temperature", "0", "--top-k", "0", "--seed", "0", "--engine", "cpu")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	tok, err := tokenizer.Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := model.NewEngine("cpu", c, model.Options{})
	p, _ := model.LoadCheckpoint(dir)
	e.SetParams(p)
	var ids []int32
	for _, id := range tok.Encode(prompt) {
		ids = append(ids, int32(id))
	}
	eos, _ := tok.EOS()
	gen, err := e.Generate(context.Background(), ids, 6, int32(eos), model.Sampling{})
	if err != nil {
		t.Fatal(err)
	}
	var text []uint32
	for _, id := range gen {
		if id != int32(eos) {
			text = append(text, uint32(id))
		}
	}
	cont, _ := tok.Decode(text)
	if want := prompt + cont + "\n"; out != want {
		t.Errorf("output %q, want %q", out, want)
	}
	if cont == "" {
		t.Error("nothing was generated")
	}
	// Sampling with a seed repeats itself.
	args := []string{"generate", "--checkpoint", dir, "--prompt", prompt, "--max-tokens", "8", "--temperature", "1", "--top-k", "40", "--seed", "7", "--engine", "cpu"}
	a, _, _ := runModelCLI(t, args...)
	b, _, _ := runModelCLI(t, args...)
	if a != b || !strings.HasPrefix(a, prompt) {
		t.Errorf("seeded sampling differs: %q vs %q", a, b)
	}
}

// A checkpoint whose weights were saved for another shape, or whose
// safetensors file was cut short, is bad input named by file and fix.
func TestGenerateCommandBadCheckpoints(t *testing.T) {
	base := func() []string {
		return []string{"--prompt", "x", "--max-tokens", "2", "--temperature", "0", "--top-k", "0", "--seed", "0", "--engine", "cpu"}
	}
	other, c := makeCheckpoint(t)
	c.Intermediate = 96
	if err := model.WriteConfig(filepath.Join(other, "config.json"), c); err != nil {
		t.Fatal(err)
	}
	trunc, _ := makeCheckpoint(t)
	st := filepath.Join(trunc, "model.safetensors")
	b, _ := os.ReadFile(st)
	if err := os.WriteFile(st, b[:len(b)-100], 0o644); err != nil {
		t.Fatal(err)
	}
	notok, _ := makeCheckpoint(t)
	os.Remove(filepath.Join(notok, "tokenizer.json"))
	garbled, _ := makeCheckpoint(t)
	if err := os.WriteFile(filepath.Join(garbled, "config.json"), []byte("{bad"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A training that diverged: one weight NaN, where it generated the
	// prompt alone and exited 0.
	diverged, dc := makeCheckpoint(t)
	dp := model.InitParams(dc, 5)
	last := dp.Specs()[len(dp.Specs())-1].Name
	dp.Tensor(last)[3] = float32(math.NaN())
	if err := model.SaveParams(filepath.Join(diverged, "model.safetensors"), dp, model.F32); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		dir  string
		want []string
	}{
		{diverged, []string{"model.safetensors holds a NaN or an infinity (" + last + ", value 3)", "use an earlier checkpoint"}},
		{other, []string{"model.safetensors", "mlp.gate_proj.weight", "[64 32]", "[96 32]", "config.json saved with them"}},
		{trunc, []string{"model.safetensors", "truncated", "save it again"}},
		{notok, []string{"no tokenizer.json"}},
		{filepath.Join(other, "missing"), []string{"config.json"}},
		{garbled, []string{"config.json is not valid JSON", "copy the one saved with the weights"}},
		{filepath.Join(other, "config.json"), []string{"is a file", "the checkpoint's directory"}},
	}
	for _, tc := range cases {
		_, errOut, code := runModelCLI(t, append([]string{"generate", "--checkpoint", tc.dir}, base()...)...)
		if code != exitBadInput {
			t.Errorf("%s: exit %d, want 2 (%s)", tc.dir, code, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%s: stderr %q lacks %q", tc.dir, errOut, w)
			}
		}
		if strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("error is not one line: %q", errOut)
		}
	}
	if _, errOut, code := runModelCLI(t, "generate", "--checkpoint", other, "--prompt", "", "--max-tokens", "2", "--temperature", "0", "--top-k", "0", "--engine", "cpu"); code != exitBadInput || !strings.Contains(errOut, `--prompt "" is empty: give the text to continue`) {
		t.Errorf("empty prompt: exit %d %q; want exit 2 saying --prompt is empty", code, errOut)
	}

	// A tokenizer without the symbol of byte 0x65 ("e") and no unknown
	// token: a prompt holding an e is refused, where the model was given
	// it without the e and the output showed it whole; one without is not.
	noE, _ := makeCheckpoint(t)
	tokPath := filepath.Join(noE, "tokenizer.json")
	tj, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(tj, &f); err != nil {
		t.Fatal(err)
	}
	m := f["model"].(map[string]any)
	for k := range m["vocab"].(map[string]any) {
		if strings.Contains(k, "e") {
			delete(m["vocab"].(map[string]any), k)
		}
	}
	m["merges"] = slices.DeleteFunc(m["merges"].([]any), func(x any) bool { return strings.Contains(fmt.Sprint(x), "e") })
	// Ids without gaps, so that every id the model may pick decodes.
	vocab := m["vocab"].(map[string]any)
	byID := slices.SortedFunc(maps.Keys(vocab), func(a, b string) int { return cmp.Compare(vocab[a].(float64), vocab[b].(float64)) })
	for i, k := range byID {
		vocab[k] = i
	}
	for _, a := range f["added_tokens"].([]any) {
		tok := a.(map[string]any)
		tok["id"] = slices.Index(byID, tok["content"].(string))
	}
	if tj, err = json.Marshal(f); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokPath, tj, 0o644); err != nil {
		t.Fatal(err)
	}
	gen := func(prompt string) (string, string, int) {
		return runModelCLI(t, append([]string{"generate", "--checkpoint", noE}, append(base(), "--prompt", prompt)...)...)
	}
	if _, errOut, code := gen("func hello"); code != exitBadInput || !strings.Contains(errOut, "--prompt holds byte 0x65 (at byte 6), for which "+tokPath+" has no symbol and no unk_token") {
		t.Errorf("a prompt with a byte the tokenizer drops: exit %d %q; want exit 2 naming the byte", code, errOut)
	}
	if got, errOut, code := gen("func main"); code != 0 || !strings.HasPrefix(got, "func main") {
		t.Errorf("a prompt without such a byte: exit %d\n%s%s", code, got, errOut)
	}
}

// --run takes a run's latest complete checkpoint from object storage (a
// real versitygw), passing over one whose upload has no completion marker,
// and generates with the checkpoint's own tokenizer exactly what the same
// checkpoint gives from a local directory.
func TestGenerateFromARunsLatestCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A tokenizer of the tiny model's 4096 ids, so that every id the model
	// can generate decodes.
	files, _ := filepath.Glob(filepath.Join(runtime.GOROOT(), "src", "strings", "*.go"))
	var inputs []io.Reader
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, bytes.NewReader(b))
	}
	tj, err := tokenizer.Train(ctx, inputs, tokenizer.TrainOptions{VocabSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Parse(tj)
	if err != nil || tk.VocabSize() != 4096 {
		t.Fatalf("test tokenizer: %v, %d ids; want 4096", err, tk.VocabSize())
	}
	tokJSON := filepath.Join(t.TempDir(), "tokenizer.json")
	os.WriteFile(tokJSON, tj, 0o644)
	tokStore := trainTestStoreBy(t, tk.SHA256(), 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	if _, errOut, code := sched(t, nil, "train", "--model", "tiny", "--tokens", tokStore, "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--steps", "2", "--checkpoint-every", "1", "--out", out, "--tokenizer-file", tokJSON); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	s3 := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []string{"step-0000001", "step-0000002"} {
		if _, err := segment.Push(ctx, objects, nil, "fox", filepath.Join(out, step)); err != nil {
			t.Fatal(err)
		}
	}
	// Step 2's upload did not finish: its marker is missing.
	if err := objects.Delete(ctx, segment.CheckpointPrefix("fox")+"step-0000002/"+segment.MarkerFile); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	env := []string{"KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey, "KILN_S3_SECRET_KEY=" + s3.SecretKey, "KILN_DATA_DIR=" + data}
	gen := []string{"generate", "--prompt", "func main", "--max-tokens", "12", "--temperature", "1", "--top-k", "20", "--seed", "3", "--engine", "cpu"}

	got, errOut, code := sched(t, env, append(gen, "--run", "fox")...)
	if code != 0 || !strings.Contains(errOut, "step 1") {
		t.Fatalf("generate --run fox: exit %d\n%s%s", code, got, errOut)
	}
	want, errOut, code := sched(t, nil, append(gen, "--checkpoint", filepath.Join(out, "step-0000001"))...)
	if code != 0 {
		t.Fatalf("generate --checkpoint: exit %d: %s", code, errOut)
	}
	if got != want || !strings.HasPrefix(got, "func main") {
		t.Fatalf("generate --run fox printed %q; the same checkpoint read locally gives %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(data, "checkpoints", "fox", "step-0000001", "model.safetensors")); err != nil {
		t.Fatalf("the checkpoint is not in the data directory: %v", err)
	}

	// Step 2 uploaded whole, then damaged in object storage: passed over,
	// with a line that says so.
	if _, err := segment.Push(ctx, objects, nil, "fox", filepath.Join(out, "step-0000002")); err != nil {
		t.Fatal(err)
	}
	key := segment.CheckpointPrefix("fox") + "step-0000002/" + trainer.ModelFile
	r, err := objects.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	b[500] ^= 0xff
	if err := objects.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	got, errOut, code = sched(t, env, append(gen, "--run", "fox")...)
	if code != 0 || got != want || !strings.Contains(errOut, "run fox: step 2 in object storage did not download intact, passed over: ") ||
		!strings.Contains(errOut, "model.safetensors has SHA-256") || !strings.Contains(errOut, "run fox: step 1, from") {
		t.Fatalf("generate --run fox with step 2 damaged: exit %d, printed %q (want %q)\n%s", code, got, want, errOut)
	}
	// What sampling reads of step 1, once: the optimizer's moments are
	// not pulled.
	local := filepath.Join(data, "checkpoints", "fox")
	if entries, _ := os.ReadDir(local); len(entries) != 1 || entries[0].Name() != "step-0000001" {
		t.Fatalf("%s holds %v; want step-0000001 alone", local, entries)
	}
	if _, err := os.Stat(filepath.Join(local, "step-0000001", trainer.OptimizerFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pulled copy holds %s (%v); sampling never reads it", trainer.OptimizerFile, err)
	}

	// Step 1 damaged in object storage too, and no copy here: every
	// checkpoint is damaged, which is what the refusal says, where it said
	// to train the run first.
	if err := os.RemoveAll(local); err != nil {
		t.Fatal(err)
	}
	key = segment.CheckpointPrefix("fox") + "step-0000001/" + trainer.ModelFile
	if err := objects.Put(ctx, key, bytes.NewReader(b[:100]), 100); err != nil {
		t.Fatal(err)
	}
	got, errOut, code = sched(t, env, append(gen, "--run", "fox")...)
	if wantLast := "run fox: no complete checkpoint in object storage (checkpoints/fox/) downloaded intact, as the lines above say"; code != 2 ||
		!strings.Contains(errOut, "run fox: step 2 in object storage did not download intact") || !strings.Contains(errOut, "run fox: step 1 in object storage did not download intact") ||
		!strings.Contains(errOut, wantLast) {
		t.Fatalf("generate --run fox with every checkpoint damaged: exit %d\n%s%s\nwant exit 2 and %q", code, got, errOut, wantLast)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--run", "pilot"}, "run pilot has no complete checkpoint in object storage (checkpoints/pilot/) yet: a run uploads one every checkpoint_every steps"},
		{[]string{"--run", "wolf"}, `no checkpoint in object storage for run "wolf": no run of that name is known here`},
		{[]string{"--run", "fox", "--checkpoint", out}, "not both"},
		{[]string{"--run", "a/b"}, `run name "a/b"`},
		// The run's own directory, where its checkpoints are: each is named,
		// where the error said it held no config.json.
		{[]string{"--checkpoint", out}, "--checkpoint " + out + " is a run's directory of 2 checkpoints: give one of them, such as " +
			filepath.Join(out, "step-0000002") + " (the newest), or --run " + filepath.Base(out) + " for the run's newest complete checkpoint in object storage"},
	} {
		_, errOut, code := sched(t, env, append(gen, c.args...)...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line with %q", c.args, code, errOut, c.want)
		}
	}
}

// A model whose vocab_size is padded past its tokenizer's ids (as many
// checkpoints are) generates only ids the tokenizer has, greedy or
// sampled, even where the padded rows' logits are the largest.
func TestGenerateSamplesOnlyTheTokenizersIds(t *testing.T) {
	dir, c := makeCheckpoint(t)
	c.VocabSize = 40000 // the tokenizer has 30093
	p := model.InitParams(c, 5)
	emb := p.Tensor("model.embed_tokens.weight")
	for i := 30093 * c.Hidden; i < len(emb); i++ {
		emb[i] *= 100 // tied: the padded ids' logits dwarf the others
	}
	if err := model.WriteConfig(filepath.Join(dir, "config.json"), c); err != nil {
		t.Fatal(err)
	}
	if err := model.SaveParams(filepath.Join(dir, "model.safetensors"), p, model.F32); err != nil {
		t.Fatal(err)
	}
	for _, temp := range []string{"0", "1"} {
		out, errOut, code := runModelCLI(t, "generate", "--checkpoint", dir, "--prompt", "func main() {", "--max-tokens", "8",
			"--temperature", temp, "--top-k", "0", "--seed", "3", "--engine", "cpu")
		if code != 0 || !strings.HasPrefix(out, "func main() {") || len(out) <= len("func main() {\n") {
			t.Errorf("temperature %s: exit %d, %q %s", temp, code, out, errOut)
		}
	}
}

// trainedRun trains the tiny model for two steps with 'sched train', a
// checkpoint after each, and returns the run's directory and the command's
// arguments (less --steps), to which a resume adds its own.
func trainedRun(t *testing.T) (string, []string) {
	t.Helper()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"train", "--model", "tiny", "--tokens", store, "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--checkpoint-every", "1", "--out", out, "--tokenizer-file", tokJSON}
	if _, errOut, code := sched(t, nil, append(args, "--steps", "2")...); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errOut)
	}
	return out, args
}

// A checkpoint training wrote is checked against the sizes and hashes its
// trainer_state.json lists before it generates, as a resume checks it: one
// whose tokenizer.json or model.safetensors was altered since is refused
// in one line that names the file and what is wrong, where before it
// generated with the altered files.
func TestGenerateRefusesAnAlteredCheckpoint(t *testing.T) {
	t.Parallel()
	out, _ := trainedRun(t)
	gen := []string{"generate", "--prompt", "func main", "--max-tokens", "4", "--temperature", "0", "--engine", "cpu", "--checkpoint"}
	step1, step2 := filepath.Join(out, "step-0000001"), filepath.Join(out, "step-0000002")
	// The optimizer's moments, which sampling never reads, deleted to save
	// the room: no damage.
	if err := os.Remove(filepath.Join(step1, trainer.OptimizerFile)); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{step1, step2} {
		if got, errOut, code := sched(t, nil, append(gen, dir)...); code != 0 || !strings.HasPrefix(got, "func main") {
			t.Fatalf("generate --checkpoint %s, intact: exit %d\n%s%s", dir, code, got, errOut)
		}
	}

	// tokenizer.json with a line added: valid still, and a byte longer.
	tokPath := filepath.Join(step1, trainer.TokenizerFile)
	tj, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokPath, append(tj, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	// model.safetensors with one weight's lowest bit flipped: the same
	// size, and loads as well as before.
	modelPath := filepath.Join(step2, trainer.ModelFile)
	b, err := os.ReadFile(modelPath)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-4] ^= 1
	if err := os.WriteFile(modelPath, b, 0o644); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct{ dir, want string }{
		{step1, fmt.Sprintf("checkpoint %s: tokenizer.json is %d bytes, trainer_state.json says %d: it was changed after the checkpoint was written (it grew): use an earlier checkpoint", step1, len(tj)+1, len(tj))},
		{step2, "checkpoint " + step2 + ": model.safetensors has SHA-256 "},
	} {
		wantBadInput(t, nil, regexp.QuoteMeta(c.want), append(gen, c.dir)...)
	}
}

// generate checks its flags before it reads a checkpoint or pulls --run's
// from object storage (here an endpoint that refuses every connection, so
// that reaching for it would be the error): a missing --prompt is told at
// once. --top-k with the default --temperature 0, which is greedy and
// would drop k without a word, is refused naming both flags.
func TestGenerateChecksItsFlagsFirst(t *testing.T) {
	t.Parallel()
	ckpt, _ := makeCheckpoint(t)
	data := t.TempDir()
	env := []string{"KILN_S3_ENDPOINT=127.0.0.1:1", "KILN_S3_ACCESS_KEY=ak", "KILN_S3_SECRET_KEY=sk", "KILN_DATA_DIR=" + data}
	topK := []string{"--top-k 5", "--temperature 0", "set --temperature above 0", "leave --top-k out"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--run", "r1"}, []string{"generate needs --prompt TEXT"}},
		{[]string{"--run", "r1", "--prompt", "x", "--top-k", "5"}, topK},
		{[]string{"--checkpoint", ckpt, "--prompt", "func main() {", "--top-k", "5", "--engine", "cpu"}, topK},
		{[]string{"--checkpoint", ckpt, "--prompt", "func main() {", "--top-k", "5", "--temperature", "0", "--engine", "cpu"}, topK},
	} {
		out, errOut, code := sched(t, env, append([]string{"generate"}, c.args...)...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("generate %v: exit %d\n%s%s; want exit 2 and one line", c.args, code, out, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("generate %v: %q lacks %q", c.args, errOut, w)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(data, "checkpoints")); !os.IsNotExist(err) {
		t.Errorf("a refused generate --run made %s: %v", filepath.Join(data, "checkpoints"), err)
	}
}
