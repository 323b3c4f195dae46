package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// runModelCLI runs sched with args and returns stdout, stderr and the exit
// code main would use.
func runModelCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	// A child process, as every run of the command is: flags set by one
	// run in this process (a bool such as --force-sm80) would stay set
	// for the next.
	return sched(t, nil, args...)
}

var goldenDir = filepath.Join("..", "..", "model", "testdata", "golden")

func TestVerifyCommandPassesOnGolden(t *testing.T) {
	for _, name := range []string{"tiny", "hd64", "moe"} {
		out, errOut, code := runModelCLI(t, "verify", "--golden", filepath.Join(goldenDir, name), "--engine", "cpu", "--precision", "fp32")
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s%s", name, code, out, errOut)
		}
		wants := []string{"loss ", "grad norm ", "model.embed_tokens.weight", "model.norm.weight", "PASS"}
		if name == "moe" {
			wants = append(wants, "aux loss ", "model.layers.1.block_sparse_moe.gate.weight", "model.layers.1.block_sparse_moe.experts.7.w2.weight")
		}
		for _, want := range wants {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", name, want, out)
			}
		}
	}
}

// "auto" takes a Mixtral golden like a Llama one: the CUDA engine where a
// GPU is found (kernels/moe_test.go checks it there), else the CPU, and
// either passes.
func TestVerifyMoEOnAutoPasses(t *testing.T) {
	moe := filepath.Join(goldenDir, "moe")
	out, errOut, code := runModelCLI(t, "verify", "--golden", moe, "--engine", "auto", "--precision", "fp32")
	if code != 0 || !strings.Contains(out, "aux loss ") || !strings.Contains(out, "PASS") {
		t.Errorf("--engine auto: exit %d\n%s%s", code, out, errOut)
	}
}

// A reference that disagrees with the engine fails with exit code 1 and a
// report that says FAIL; the golden files themselves are left alone.
func TestVerifyCommandFailsBeyondTolerance(t *testing.T) {
	dir := copyGolden(t, "tiny")
	ex := filepath.Join(dir, "expected.json")
	b, _ := os.ReadFile(ex)
	b = bytes.Replace(b, []byte(`"loss": 6.26`), []byte(`"loss": 6.36`), 1)
	if err := os.WriteFile(ex, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runModelCLI(t, "verify", "--golden", dir, "--engine", "cpu", "--precision", "fp32")
	if code != exitFailure {
		t.Fatalf("exit %d, want %d\n%s%s", code, exitFailure, out, errOut)
	}
	if !strings.Contains(out, "FAIL") || !strings.Contains(errOut, "beyond tolerance") {
		t.Errorf("failure not reported:\n%s%s", out, errOut)
	}
	// The same run through the Go function reports the error as such.
	err := runVerify(context.Background(), new(bytes.Buffer), new(bytes.Buffer), verifyFlags{golden: dir, engine: "cpu", precision: "fp32"})
	if !errors.Is(err, model.ErrVerifyFailed) {
		t.Errorf("runVerify: %v, want ErrVerifyFailed", err)
	}
	// A looser loss tolerance from the flags makes it pass.
	if _, _, code := runModelCLI(t, "verify", "--golden", dir, "--engine", "cpu", "--precision", "fp32", "--loss-rtol", "0.05"); code != 0 {
		t.Errorf("--loss-rtol 0.05: exit %d, want 0", code)
	}
}

func TestVerifyCommandBadInput(t *testing.T) {
	trunc := copyGolden(t, "tiny")
	grads := filepath.Join(trunc, "grads.safetensors")
	b, _ := os.ReadFile(grads)
	if err := os.WriteFile(grads, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"verify", "--golden", "", "--engine", "cpu", "--precision", "fp32"}, "needs --golden"},
		{[]string{"verify", "--golden", filepath.Join(goldenDir, "nope"), "--engine", "cpu", "--precision", "fp32"}, "is not a directory"},
		{[]string{"verify", "--golden", filepath.Join(goldenDir, "tiny"), "--engine", "tpu", "--precision", "fp32"}, `unknown --engine "tpu"`},
		{[]string{"verify", "--golden", filepath.Join(goldenDir, "tiny"), "--engine", "cpu", "--precision", "fp8"}, "fp8"},
		{[]string{"verify", "--golden", trunc, "--engine", "cpu", "--precision", "fp32"}, "grads.safetensors: truncated"},
		{[]string{"verify", "--golden", filepath.Join(goldenDir, "tiny"), "--engine", "cpu", "--precision", "fp32", "--force-sm80"}, "--force-sm80 builds the CUDA engine's kernels"},
	}
	for _, c := range cases {
		_, errOut, code := runModelCLI(t, c.args...)
		if code != exitBadInput || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

func copyGolden(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	entries, err := os.ReadDir(filepath.Join(goldenDir, name))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(goldenDir, name, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
