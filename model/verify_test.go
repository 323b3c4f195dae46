package model

import (
	"bytes"
	"context"
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
	dir := t.TempDir()
	src := filepath.Join("testdata", "golden", "moe")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "expected.json" {
			b = bytes.Replace(b, []byte(`"aux_loss": 2.18`), []byte(`"aux_loss": 2.20`), 1)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r, err := Verify(context.Background(), dir, VerifyOptions{Engine: "cpu", Precision: "fp32"})
	if err != nil {
		t.Fatal(err)
	}
	if r.Pass || r.AuxOK || !r.LossOK {
		t.Errorf("pass %v, aux ok %v, loss ok %v: want only the aux loss to fail", r.Pass, r.AuxOK, r.LossOK)
	}
}
