package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokenizer"
)

// Every bad number on the command line exits 2 with one line that names
// the flag: zero sizes, NaN and infinities, unknown engines, and sizes that
// cannot fit the host.
func TestBadNumbersExitTwoNamingTheFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ckpt, _ := makeCheckpoint(t)
	cfg := filepath.Join(dir, "run.yaml")
	os.WriteFile(cfg, []byte("model: tiny\nbatch: 0\ntotal_steps: 10\n"), 0o644)
	tpu := filepath.Join(dir, "tpu.yaml")
	os.WriteFile(tpu, []byte("model: tiny\nengine: tpu\ntotal_steps: 10\n"), 0o644)
	train := []string{"train", "--tokens", dir, "--steps", "10", "--out", filepath.Join(dir, "out")}
	gen := []string{"generate", "--checkpoint", ckpt, "--prompt", "func main() {"}
	golden := []string{"verify", "--golden", filepath.Join(goldenDir, "tiny")}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"bench", "--batch", "0"}, []string{"--batch"}},
		{[]string{"bench", "--seq", "0"}, []string{"--seq"}},
		{[]string{"bench", "--engine", "tpu"}, []string{`"tpu"`, "cpu, cuda, auto"}},
		{[]string{"bench", "--peak-tflops", "NaN"}, []string{"--peak-tflops"}},
		{[]string{"bench", "--model", "tiny", "--engine", "cpu", "--batch", "100000000", "--seq", "1024"},
			[]string{"batch 100000000 x seq 1024", "needs", "this host has", "available", "--batch"}},
		{append(train, "--batch", "0"), []string{"--batch 0", "at least 1"}},
		{append(train, "--seq", "0"), []string{"--seq 0"}},
		{append(train, "--accumulate", "0"), []string{"--accumulate 0"}},
		{append(train, "--lr", "NaN"), []string{"--lr NaN", "finite"}},
		{append(train, "--lr", "Inf"), []string{"--lr +Inf", "finite"}},
		{append(train, "--engine", "tpu"), []string{`"tpu"`, "cpu, cuda, auto"}},
		{append(train, "--steps", "-5"), []string{"--steps -5", "at least 1"}},
		{append(train, "--total-tokens", "0"), []string{"--total-tokens 0"}},
		{append(train, "--warmup", "-5"), []string{"--warmup -5", "0 or more"}},
		{append(train, "--eval-every", "-1"), []string{"--eval-every -1"}},
		{append(train, "--checkpoint-every", "-1"), []string{"--checkpoint-every -1"}},
		{append(train, "--log-every", "-2"), []string{"--log-every -2"}},
		{append(train, "--log-every", "0"), []string{"--log-every 0", "at least 1"}},
		{[]string{"train", "--tokens", dir, "--out", filepath.Join(dir, "out")}, []string{"--steps N", "--total-tokens N"}},
		{[]string{"train", "--tokens", dir + "=Inf", "--steps", "10"}, []string{"--tokens", "finite positive"}},
		{[]string{"train", "--run-config", cfg, "--tokens", dir}, []string{cfg, "batch is 0"}},
		{[]string{"train", "--run-config", tpu, "--tokens", dir}, []string{"run config " + tpu, `engine "tpu"`}},
		{append(gen, "--temperature", "NaN"), []string{"--temperature", "finite"}},
		{append(gen, "--temperature", "+Inf"), []string{"--temperature", "finite"}},
		{append(gen, "--engine", "tpu"), []string{`"tpu"`, "cpu, cuda, auto"}},
		{append(gen, "--max-tokens", "100000000"), []string{"--max-tokens 100000000", "256 positions"}},
		{append(gen, "--max-tokens", "0"), []string{"--max-tokens 0", "at least 1"}},
		{append(golden, "--loss-rtol", "Inf"), []string{"--loss-rtol +Inf", "finite"}},
		{append(golden, "--grad-rtol", "NaN"), []string{"--grad-rtol NaN"}},
		// A fraction: at 1 or above no weight would be checked.
		{append(golden, "--significant", "2"), []string{"--significant 2: give a fraction of a tensor's largest gradient below 1"}},
		{append(golden, "--engine", "tpu"), []string{`"tpu"`}},
		{[]string{"enqueue", "bench", "tiny", "--batch", "100000000"}, []string{"batch 100000000 x seq 1024", "141 GB", "--batch"}},
		{[]string{"enqueue", "bench", "tiny", "--batch", "100000000", "--engine", "cpu"}, []string{"cpu engine", "141 GB"}},
		{[]string{"enqueue", "bench", "tiny", "--batch", "0"}, []string{"--batch 0"}},
		{[]string{"enqueue", "bench", "tiny", "--seq", "4096"}, []string{"--seq 4096", "1024 positions"}},
		{[]string{"enqueue", "bench", "tiny", "--engine", "tpu"}, []string{`"tpu"`, "cpu, cuda, auto"}},
	} {
		_, errOut, code := sched(t, nil, c.args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2: %s", c.args, code, errOut)
			continue
		}
		if lines := strings.Count(strings.TrimSpace(errOut), "\n") + 1; lines != 1 {
			t.Errorf("%v: %d lines on stderr, want 1: %s", c.args, lines, errOut)
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr lacks %q: %s", c.args, w, errOut)
			}
		}
	}
}

// A tokenizer with no end-of-text token cannot separate documents in a
// token store: ingest refuses it naming the file and what to add.
func TestIngestRefusesATokenizerWithoutEOS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("package main\nfunc f() {}\n", 100))},
		tokenizer.TrainOptions{VocabSize: 280, SpecialTokens: []string{"<pad>"}})
	if err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "noeos.json")
	os.WriteFile(tok, b, 0o644)
	os.WriteFile(filepath.Join(dir, "a.jsonl"), []byte(`{"text":"package main"}`+"\n"), 0o644)
	store := filepath.Join(dir, "store")
	_, errOut, code := sched(t, nil, "ingest", "local:"+filepath.Join(dir, "*.jsonl"), "--direct", "--store-dir", store, "--tokenizer-file", tok)
	if code != 2 || !strings.Contains(errOut, tok) || !strings.Contains(errOut, "<|endoftext|>") || !strings.Contains(errOut, "added_tokens") {
		t.Fatalf("exit %d, want 2 naming %s and what to add: %s", code, tok, errOut)
	}
	if _, err := os.Stat(filepath.Join(store, "tokens.bin")); !os.IsNotExist(err) {
		t.Errorf("the refused ingest left a token store: %v", err)
	}
}

// A config.json of 1e8 layers next to tiny weights: generate and verify
// exit 2 with one line, and the process never holds 1 GiB (its peak
// resident set, as the kernel counted it, is read after it exits).
func TestOversizedConfigExitsTwoWithinOneGiB(t *testing.T) {
	t.Parallel()
	ckpt, c := makeCheckpoint(t)
	huge := c
	huge.Layers = 100000000
	if err := model.WriteConfig(filepath.Join(ckpt, "config.json"), huge); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join(t.TempDir(), "golden")
	os.MkdirAll(golden, 0o755)
	for _, f := range []string{"model.safetensors", "batch.safetensors", "grads.safetensors", "after_adamw_step.safetensors", "expected.json"} {
		b, err := os.ReadFile(filepath.Join(goldenDir, "tiny", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(golden, f), b, 0o644)
	}
	gc, err := model.ReadConfig(filepath.Join(goldenDir, "tiny", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	gc.Layers = 100000000
	model.WriteConfig(filepath.Join(golden, "config.json"), gc)

	for _, args := range [][]string{
		{"generate", "--checkpoint", ckpt, "--prompt", "func main() {", "--engine", "cpu"},
		{"verify", "--golden", golden, "--engine", "cpu"},
	} {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = baseEnv(t)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		msg := strings.TrimSpace(errOut.String())
		if code != 2 || strings.Contains(msg, "\n") || !strings.Contains(msg, "num_hidden_layers 100000000") {
			t.Errorf("%s: exit %d, want 2 with one line naming num_hidden_layers: %s", args[0], code, msg)
		}
		// Maxrss is in kilobytes on Linux.
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			if rss := ru.Maxrss * 1024; rss >= 1<<30 {
				t.Errorf("%s: peak RSS %d bytes, want under 1 GiB", args[0], rss)
			} else {
				t.Logf("%s: peak RSS %.1f MiB", args[0], float64(rss)/(1<<20))
			}
		} else {
			t.Errorf("%s: no resource usage for the child", args[0])
		}
	}
}

// A size flag given a bare number with a fraction is refused naming the
// flag and how to write the size, rather than read as whole bytes:
// --max-disk 1.5 was 1 byte and 0.5 was refused as "not positive". The
// flags are checked before Redis or the object store is reached, so none
// is started here; a size with a unit still passes the check.
func TestSizeFlagsRefuseAFractionOfAByte(t *testing.T) {
	t.Parallel()
	glob := "local:" + filepath.Join(t.TempDir(), "*.jsonl")
	env := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"ingest", glob, "--direct", "--store", "s", "--max-disk", "1.5"}, "--max-disk"},
		{[]string{"ingest", glob, "--direct", "--store", "s", "--max-disk", "0.5"}, "--max-disk"},
		{[]string{"enqueue", "ingest", glob, "--store", "s", "--max-disk", "1.5"}, "--max-disk"},
		{[]string{"enqueue", "tokenizer", "t", "--sample", "1.5"}, "--sample"},
	} {
		_, errOut, code := sched(t, env, c.args...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line", c.args, code, errOut)
			continue
		}
		for _, want := range []string{c.flag, `"` + c.args[len(c.args)-1] + `"`, "1.5GB", "1.5GiB", "1500000000"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%v: %q lacks %q", c.args, errOut, want)
			}
		}
	}
	for _, size := range []string{"1.5GB", "1.5GiB", "1500000000"} {
		_, errOut, _ := sched(t, env, "ingest", glob, "--direct", "--store", "s", "--max-disk", size, "--tokenizer", "none")
		if strings.Contains(errOut, "--max-disk") {
			t.Errorf("--max-disk %s: refused: %q", size, errOut)
		}
	}
}
