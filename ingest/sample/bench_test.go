package sample

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest"
)

// BenchmarkDrawJSONL measures sampling from local JSON lines files: the
// decode, the held-out choice and the buffered writes, without the hub.
// Bytes/s is document text drawn.
func BenchmarkDrawJSONL(b *testing.B) {
	dir := b.TempDir()
	doc := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 40)
	for f := range 8 {
		var buf bytes.Buffer
		for i := range 2000 {
			line, _ := json.Marshal(map[string]string{"text": fmt.Sprintf("%d %d %s", f, i, doc)})
			buf.Write(append(line, '\n'))
		}
		os.WriteFile(filepath.Join(dir, fmt.Sprintf("part-%d.jsonl", f)), buf.Bytes(), 0o644)
	}
	preset, err := ingest.LookupPreset(nil, "local:"+filepath.Join(dir, "*.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	const budget = 8 << 20
	b.SetBytes(budget)
	b.ResetTimer()
	for range b.N {
		st, err := Draw(context.Background(), Options{Preset: preset, Bytes: budget, Seed: 1, Spread: 4}, io.Discard, io.Discard)
		if err != nil || st.Bytes != budget {
			b.Fatalf("%+v %v", st, err)
		}
	}
}
