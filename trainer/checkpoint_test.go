package trainer

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"go.uber.org/zap"
)

func testSnapshot(t *testing.T, step int) *Snapshot {
	t.Helper()
	c, _ := model.Preset("tiny")
	c.VocabSize, c.Layers = 64, 1
	p := model.NewParams(c)
	for i := range p.Data {
		p.Data[i] = float32(i%97)*0.01 - 0.3
	}
	o := &model.OptimizerState{Step: step, M: make([]float32, len(p.Data)), V: make([]float32, len(p.Data))}
	for i := range o.M {
		o.M[i], o.V[i] = float32(i)*1e-6, float32(i%13)*1e-8
	}
	return &Snapshot{Config: c, Params: p, Optimizer: o, Tokenizer: []byte(`{"model":{"type":"BPE"}}`),
		State: State{Step: step, Tokens: int64(step) * 1000, Cursor: json.RawMessage(`{"pos":7}`), RNG: RNGState{Seed: 3},
			Run: RunConfig{Model: "tiny", Seq: 16}, Loss: 2.5}}
}

func TestCheckpointRoundTrip(t *testing.T) {
	root := t.TempDir()
	s := testSnapshot(t, 12)
	dir, err := WriteCheckpoint(context.Background(), root, s)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(dir) != "step-0000012" {
		t.Errorf("directory %s, want step-0000012", dir)
	}
	for _, f := range []string{ConfigFile, ModelFile, TokenizerFile, OptimizerFile, StateFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("missing %s: %v", f, err)
		}
	}
	got, err := ReadCheckpoint(dir, &s.Config)
	if err != nil {
		t.Fatal(err)
	}
	for i := range s.Params.Data {
		if got.Params.Data[i] != s.Params.Data[i] || got.Optimizer.M[i] != s.Optimizer.M[i] || got.Optimizer.V[i] != s.Optimizer.V[i] {
			t.Fatalf("value %d differs after the round trip", i)
		}
	}
	if got.Optimizer.Step != 12 || got.State.Step != 12 || got.State.Tokens != 12000 || compactJSON(got.State.Cursor) != `{"pos":7}` ||
		got.State.RNG.Seed != 3 || got.State.Run.Seq != 16 || string(got.Tokenizer) != string(s.Tokenizer) {
		t.Errorf("state differs: %+v", got.State)
	}
}

// model.safetensors must be what transformers loads: HF names, F32, and the
// {"format": "pt"} metadata, with the data aligned after the header.
func TestCheckpointModelFileHeader(t *testing.T) {
	s := testSnapshot(t, 1)
	dir, err := WriteCheckpoint(context.Background(), t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(b[:8])
	if n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	var h map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &h); err != nil {
		t.Fatal(err)
	}
	if string(h["__metadata__"]) != `{"format":"pt"}` {
		t.Errorf("metadata %s", h["__metadata__"])
	}
	if len(h) != len(s.Params.Specs())+1 {
		t.Errorf("%d entries, want %d tensors and the metadata", len(h), len(s.Params.Specs()))
	}
	c := s.Config
	if want := fmt.Sprintf(`"dtype":"F32","shape":[%d,%d]`, c.KVHeads*c.HeadDim, c.Hidden); !strings.Contains(string(h["model.layers.0.self_attn.k_proj.weight"]), want) {
		t.Errorf("k_proj entry: %s", h["model.layers.0.self_attn.k_proj.weight"])
	}
	if uint64(len(b)) != 8+n+uint64(4*len(s.Params.Data)) {
		t.Errorf("file is %d bytes, want header plus %d values", len(b), len(s.Params.Data))
	}
}

// A crash while writing leaves a temporary directory or a step directory
// whose files do not match trainer_state.json; neither may look valid.
func TestHalfWrittenCheckpointsAreNotValid(t *testing.T) {
	root := t.TempDir()
	ctx := context.Background()
	good, err := WriteCheckpoint(ctx, root, testSnapshot(t, 10))
	if err != nil {
		t.Fatal(err)
	}
	for name, spoil := range map[string]func(dir string){
		"no state file":        func(dir string) { os.Remove(filepath.Join(dir, StateFile)) },
		"truncated model":      func(dir string) { os.Truncate(filepath.Join(dir, ModelFile), 100) },
		"missing optimizer":    func(dir string) { os.Remove(filepath.Join(dir, OptimizerFile)) },
		"state file cut short": func(dir string) { os.Truncate(filepath.Join(dir, StateFile), 30) },
	} {
		dir, err := WriteCheckpoint(ctx, root, testSnapshot(t, 20))
		if err != nil {
			t.Fatal(err)
		}
		spoil(dir)
		if _, err := CheckCheckpoint(dir); err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("%s: CheckCheckpoint = %v, want an error naming %s", name, err, dir)
		}
		if _, err := ReadCheckpoint(dir, nil); err == nil || !isBadInput(err) {
			t.Errorf("%s: ReadCheckpoint = %v, want a bad-input error", name, err)
		}
		if latest, _, err := LatestIntactCheckpoint(root, zap.NewNop()); err != nil || latest != good {
			t.Errorf("%s: LatestIntactCheckpoint = %s, %v; want the good %s", name, latest, err, good)
		}
	}
	// A temporary directory from a crashed write is ignored, then removed.
	os.MkdirAll(filepath.Join(root, ".tmp-step-123"), 0o755)
	if latest, _, _ := LatestIntactCheckpoint(root, zap.NewNop()); latest != good {
		t.Errorf("LatestIntactCheckpoint = %s with a stale temp dir, want %s", latest, good)
	}
	if _, err := WriteCheckpoint(ctx, root, testSnapshot(t, 30)); err != nil {
		t.Fatal(err)
	}
	if stale, _ := filepath.Glob(filepath.Join(root, ".tmp-step-*")); len(stale) != 0 {
		t.Errorf("stale temp dirs left: %v", stale)
	}
	if latest, _, _ := LatestIntactCheckpoint(root, zap.NewNop()); filepath.Base(latest) != "step-0000030" {
		t.Errorf("LatestIntactCheckpoint = %s, want step-0000030", latest)
	}
}

func TestCorruptedCheckpointIsRefusedOnRead(t *testing.T) {
	dir, err := WriteCheckpoint(context.Background(), t.TempDir(), testSnapshot(t, 5))
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.OpenFile(filepath.Join(dir, ModelFile), os.O_WRONLY, 0)
	f.WriteAt([]byte{0xff, 0xff}, 200)
	f.Close()
	_, err = ReadCheckpoint(dir, nil)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "model.safetensors has SHA-256") {
		t.Fatalf("want a hash mismatch naming model.safetensors, got %v", err)
	}
}

func TestCheckpointOfAnotherShapeIsRefused(t *testing.T) {
	s := testSnapshot(t, 5)
	dir, err := WriteCheckpoint(context.Background(), t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	other := s.Config
	other.Hidden, other.Heads, other.KVHeads = 256, 4, 4
	_, err = ReadCheckpoint(dir, &other)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), dir) ||
		!strings.Contains(err.Error(), fmt.Sprintf("d_model %d", s.Config.Hidden)) || !strings.Contains(err.Error(), "d_model 256") {
		t.Fatalf("want a bad-input error naming the directory and both shapes, got %v", err)
	}
}

func TestLatestCheckpointOfEmptyRoot(t *testing.T) {
	if _, _, err := LatestIntactCheckpoint(filepath.Join(t.TempDir(), "absent"), zap.NewNop()); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("absent root: %v", err)
	}
	if _, _, err := LatestIntactCheckpoint(t.TempDir(), zap.NewNop()); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("empty root: %v", err)
	}
}

func compactJSON(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return "invalid: " + err.Error()
	}
	return buf.String()
}
