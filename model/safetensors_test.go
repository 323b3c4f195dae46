package model

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Loading transformers' model.safetensors and saving it again must give the
// same file, byte for byte: names, shapes, dtypes, offsets, the
// {"format":"pt"} metadata and the header padding.
func TestSaveReproducesGoldenFile(t *testing.T) {
	for _, name := range []string{"tiny", "hd64"} {
		dir := filepath.Join("testdata", "golden", name)
		c, err := ReadConfig(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		p, err := LoadParams(filepath.Join(dir, "model.safetensors"), c)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "model.safetensors")
		if err := SaveParams(out, p, F32); err != nil {
			t.Fatal(err)
		}
		want, _ := os.ReadFile(filepath.Join(dir, "model.safetensors"))
		got, _ := os.ReadFile(out)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: saved file differs from transformers' (%d vs %d bytes); header:\n%s\nwant:\n%s", name, len(got), len(want), header(got), header(want))
		}
		if c.TieEmbeddings && strings.Contains(header(got), "lm_head") {
			t.Errorf("%s: tied model wrote lm_head.weight", name)
		}
	}
}

// The batch file mixes F32 and I32 and has no metadata; re-encoding it must
// give the same bytes (F32 laid out before I32, as the safetensors library
// orders dtypes).
func TestBatchFileRoundTrip(t *testing.T) {
	path := filepath.Join("testdata", "golden", "tiny", "batch.safetensors")
	want, _ := os.ReadFile(path)
	f, err := DecodeSafetensors(path, want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := EncodeSafetensors(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("re-encoded batch differs: %s\nwant %s", header(got), header(want))
	}
	ids, err := f.Tensor("input_ids").Int32s()
	if err != nil || len(ids) != 2*32 {
		t.Fatalf("input_ids: %v, %d values", err, len(ids))
	}
}

func header(b []byte) string {
	if len(b) < 8 {
		return ""
	}
	n := int(b[0]) | int(b[1])<<8 | int(b[2])<<16
	return string(b[8 : 8+n])
}

func TestBF16RoundTrip(t *testing.T) {
	c := Presets["tiny"]
	c.Layers = 1
	p := InitParams(c, 7)
	path := filepath.Join(t.TempDir(), "m.safetensors")
	if err := SaveParams(path, p, BF16); err != nil {
		t.Fatal(err)
	}
	q, err := LoadParams(path, c)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range p.Data {
		if q.Data[i] != FromBF16(ToBF16(v)) {
			t.Fatalf("value %d: %g loaded as %g, want %g", i, v, q.Data[i], FromBF16(ToBF16(v)))
		}
		if d := q.Data[i] - v; d > 1.0/256*abs32(v) || -d > 1.0/256*abs32(v) {
			t.Fatalf("value %d: bf16 error %g too large for %g", i, d, v)
		}
	}
	// Round to nearest even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7.
	if got := ToBF16(1 + 1.0/256); got != 0x3f80 {
		t.Errorf("ToBF16(1+2^-8) = %#x, want 0x3f80 (ties to even)", got)
	}
}

func abs32(x float32) float32 {
	if x < 0 {
		return -x
	}
	return x
}

// A file cut short, at any point, is reported as truncated with its path
// and what to do; it is never half-read.
func TestTruncatedSafetensors(t *testing.T) {
	src := filepath.Join("testdata", "golden", "tiny", "model.safetensors")
	full, _ := os.ReadFile(src)
	c, _ := ReadConfig(filepath.Join("testdata", "golden", "tiny", "config.json"))
	dir := t.TempDir()
	for _, n := range []int{0, 5, 100, 2064 + 8 + 1000, len(full) - 1} {
		path := filepath.Join(dir, "model.safetensors")
		if err := os.WriteFile(path, full[:n], 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadParams(path, c)
		var fe *FormatError
		if !errors.As(err, &fe) {
			t.Fatalf("cut at %d: got %v, want a FormatError", n, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, path) || !strings.Contains(msg, "truncated") || !strings.Contains(msg, "again") {
			t.Errorf("cut at %d: error %q should name the file, say truncated and say what to do", n, msg)
		}
		if !fe.BadInput() {
			t.Error("a truncated file is bad input")
		}
	}
}

// Weights saved for one model size and loaded with another's config name
// the tensor and both shapes.
func TestLoadCheckpointOfAnotherShape(t *testing.T) {
	path := filepath.Join("testdata", "golden", "tiny", "model.safetensors")
	c, _ := ReadConfig(filepath.Join("testdata", "golden", "tiny", "config.json"))
	other := c
	other.Hidden = 128
	other.HeadDim = 32
	_, err := LoadParams(path, other)
	var se *ShapeError
	if !errors.As(err, &se) {
		t.Fatalf("got %v, want a ShapeError", err)
	}
	msg := err.Error()
	for _, want := range []string{path, "model.embed_tokens.weight", "[512 64]", "[512 128]", "config.json"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	// An untied config against a tied file: lm_head.weight is missing.
	untied := c
	untied.TieEmbeddings = false
	if _, err := LoadParams(path, untied); err == nil || !strings.Contains(err.Error(), "lm_head.weight") {
		t.Errorf("untied config on a tied file: %v, want lm_head.weight named", err)
	}
	// A tied config against an untied file: the extra lm_head is named.
	hd64 := filepath.Join("testdata", "golden", "hd64")
	ch, _ := ReadConfig(filepath.Join(hd64, "config.json"))
	ch.TieEmbeddings = true
	if _, err := LoadParams(filepath.Join(hd64, "model.safetensors"), ch); err == nil || !strings.Contains(err.Error(), "tie_word_embeddings false") {
		t.Errorf("tied config on an untied file: %v, want the fix named", err)
	}
}

func TestDecodeRejectsMalformedHeaders(t *testing.T) {
	cases := map[string]string{
		"not json":     "{nope",
		"bad dtype":    `{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}`,
		"size differs": `{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`,
	}
	for name, h := range cases {
		b := make([]byte, 8, 8+len(h)+16)
		b[0] = byte(len(h))
		b = append(b, h...)
		b = append(b, make([]byte, 16)...)
		if _, err := DecodeSafetensors("x.safetensors", b); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.HasPrefix(err.Error(), "x.safetensors: ") {
			t.Errorf("%s: error %q does not name the file", name, err)
		}
	}
}

// A config.json of 1e8 layers next to tiny weights is refused from the
// header alone, naming both counts, without sizing anything from it.
func TestLoadParamsRefusesAConfigTheWeightsDoNotHave(t *testing.T) {
	dir := filepath.Join("testdata", "golden", "tiny")
	path := filepath.Join(dir, "model.safetensors")
	c, err := ReadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	huge := c
	huge.Layers = 100000000
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = LoadParams(path, huge)
	runtime.ReadMemStats(&after)
	var fe *FormatError
	if !errors.As(err, &fe) || !fe.BadInput() {
		t.Fatalf("got %v, want a FormatError", err)
	}
	for _, want := range []string{path, fmt.Sprintf("holds %d decoder layer(s)", c.Layers), "num_hidden_layers 100000000", "config.json saved with"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 8<<20 {
		t.Errorf("refusing the config allocated %d bytes", d)
	}
	// The same refusal from a decoded file (trainer.ReadCheckpoint's path).
	f, err := ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParamsFromFile(path, f, huge); !errors.As(err, &fe) {
		t.Errorf("ParamsFromFile: %v, want a FormatError", err)
	}
	huge = c
	huge.VocabSize = 1 << 40
	if _, err := LoadParams(path, huge); err == nil || !strings.Contains(err.Error(), "model.embed_tokens.weight") {
		t.Errorf("vocab 2^40: %v", err)
	}
}

// The header is read alone: a file whose data is cut short is reported
// from its header and size, and an intact one lists its tensors.
func TestReadSafetensorsHeader(t *testing.T) {
	src := filepath.Join("testdata", "golden", "tiny", "model.safetensors")
	h, err := ReadSafetensorsHeader(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ReadSafetensors(src)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != len(f.Tensors) || h[0].Name != f.Tensors[0].Name || !slices.Equal(h[0].Shape, f.Tensors[0].Shape) {
		t.Errorf("header lists %d tensors (first %v), the file %d", len(h), h[0], len(f.Tensors))
	}
	b, _ := os.ReadFile(src)
	cut := filepath.Join(t.TempDir(), "cut.safetensors")
	os.WriteFile(cut, b[:len(b)-4], 0o644)
	var fe *FormatError
	if _, err := ReadSafetensorsHeader(cut); !errors.As(err, &fe) || !strings.Contains(err.Error(), "truncated") {
		t.Errorf("cut file: %v", err)
	}
}
