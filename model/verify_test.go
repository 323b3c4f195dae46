package model

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every golden directory, written by transformers 5.17 in fp32, must pass
// at the fp32 tolerances: tiny has tied embeddings and head_dim 16, hd64 has
// untied embeddings, head_dim 64 and one key/value head for two query heads,
// moe is MixtralForCausalLM (8 experts, top 2, the load-balancing loss at
// 0.02) on hd64's attention.
func TestVerifyGolden(t *testing.T) {
	for _, name := range []string{"tiny", "hd64", "moe"} {
		t.Run(name, func(t *testing.T) {
			r, err := Verify(context.Background(), filepath.Join("testdata", "golden", name), VerifyOptions{Engine: "cpu", Precision: "fp32"})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := r.Write(&out); err != nil {
				t.Fatal(err)
			}
			t.Log("\n" + out.String())
			if !r.Pass {
				t.Fatalf("golden %s fails:\n%s", name, out.String())
			}
			if (name == "moe") != strings.Contains(out.String(), "aux loss ") {
				t.Errorf("aux loss line present %v for %s:\n%s", !(name == "moe"), name, out.String())
			}
			if !strings.HasSuffix(out.String(), "PASS\n") {
				t.Errorf("report does not end in PASS:\n%s", out.String())
			}
		})
	}
}

// The load-balancing loss is checked on its own: a golden whose aux_loss
// is off by 1% fails even though the total loss is untouched.
func TestVerifyChecksAuxLoss(t *testing.T) {
	dir := copyGolden(t, "moe")
	path := filepath.Join(dir, "expected.json")
	b, _ := os.ReadFile(path)
	os.WriteFile(path, bytes.Replace(b, []byte(`"aux_loss": 2.18`), []byte(`"aux_loss": 2.20`), 1), 0o644)
	r, err := Verify(context.Background(), dir, VerifyOptions{Engine: "cpu", Precision: "fp32"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pass || r.AuxOK || !r.LossOK {
		t.Errorf("pass %v, aux ok %v, loss ok %v: want only the aux loss to fail", r.Pass, r.AuxOK, r.LossOK)
	}
}

// A golden directory missing a value to compare against (the logits, the
// loss, an AdamW setting) is refused naming the file and what it needs,
// where the value was taken as 0 or left unchecked.
func TestVerifyRefusesAnIncompleteGolden(t *testing.T) {
	for _, c := range []struct {
		name  string
		spoil func(t *testing.T, dir string)
		want  string
	}{
		{"no logits", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "batch.safetensors")
			bf, err := ReadSafetensors(path)
			if err != nil {
				t.Fatal(err)
			}
			ids := bf.Tensor("input_ids")
			in, _ := ids.Int32s()
			if err := WriteSafetensors(path, &SafetensorsFile{Tensors: []Tensor{I32Tensor("input_ids", ids.Shape, in)}}); err != nil {
				t.Fatal(err)
			}
		}, "batch.safetensors: needs logits"},
		{"an id past the vocabulary", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "batch.safetensors")
			bf, err := ReadSafetensors(path)
			if err != nil {
				t.Fatal(err)
			}
			for i, tn := range bf.Tensors {
				if tn.Name == "input_ids" {
					in, _ := tn.Int32s()
					in[3] = 99999
					bf.Tensors[i] = I32Tensor("input_ids", tn.Shape, in)
				}
			}
			if err := WriteSafetensors(path, bf); err != nil {
				t.Fatal(err)
			}
		}, "input_ids holds 99999 at position 3, outside config.json's vocab_size"},
		{"no grads", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "grads.safetensors"))
		}, "golden directory has no grads.safetensors"},
		{"empty expected.json", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "expected.json"), []byte("{}"), 0o644)
		}, `expected.json: has no "loss"`},
		{"no adamw.lr", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "expected.json")
			b, _ := os.ReadFile(path)
			os.WriteFile(path, bytes.Replace(b, []byte(`"lr"`), []byte(`"learning_rate"`), 1), 0o644)
		}, "has no adamw.lr"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := copyGolden(t, "tiny")
			c.spoil(t, dir)
			_, err := Verify(context.Background(), dir, VerifyOptions{Engine: "cpu", Precision: "fp32"})
			var bad interface{ BadInput() bool }
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &bad) {
				t.Errorf("Verify = %v, want bad input with %q", err, c.want)
			}
		})
	}
}

// copyGolden copies the golden directory name into a temporary one, for a
// test to change.
func copyGolden(t *testing.T, name string) string {
	t.Helper()
	src, dir := filepath.Join("testdata", "golden", name), t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
