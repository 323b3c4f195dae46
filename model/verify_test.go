package model

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// Both golden directories, written by transformers 5.17 in fp32, must pass
// at the fp32 tolerances: tiny has tied embeddings and head_dim 16, hd64 has
// untied embeddings, head_dim 64 and one key/value head for two query heads.
func TestVerifyGolden(t *testing.T) {
	for _, name := range []string{"tiny", "hd64"} {
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
			if !strings.HasSuffix(out.String(), "PASS\n") {
				t.Errorf("report does not end in PASS:\n%s", out.String())
			}
		})
	}
}
