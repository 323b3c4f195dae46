package trainer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// A checkpoint whose config.json (hash updated to match) claims 1e8 layers
// beside its one-layer weights is refused as bad input from the weights'
// header, before anything is sized from the config.
func TestReadCheckpointRefusesAConfigTheWeightsDoNotHave(t *testing.T) {
	s := testSnapshot(t, 1)
	dir, err := WriteCheckpoint(context.Background(), t.TempDir(), s)
	if err != nil {
		t.Fatal(err)
	}
	huge := s.Config
	huge.Layers = 100000000
	b, err := model.MarshalConfig(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var st State
	sb, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(sb, &st); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	st.Files[ConfigFile] = FileSum{Size: int64(len(b)), SHA256: hex.EncodeToString(sum[:])}
	if sb, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile), sb, 0o644); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = ReadCheckpoint(dir, nil)
	runtime.ReadMemStats(&after)
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() {
		t.Fatalf("got %v, want bad input", err)
	}
	for _, want := range []string{"holds 1 decoder layer(s)", "num_hidden_layers 100000000"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 16<<20 {
		t.Errorf("refusing the checkpoint allocated %d bytes", d)
	}
}
