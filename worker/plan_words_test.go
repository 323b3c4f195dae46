package worker

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

// A plan counts the files its store holds as skipped whole (a file cut
// short) with those appended, as the store's status lists them, and says
// so: it said "already in the store" of a file none of whose text is in
// it.
func TestAPlanCountsAFileSkippedWholeAsAppendedOrSkipped(t *testing.T) {
	e := newLocalIngestEnv(t, t.TempDir())
	root, storesDir := t.TempDir(), t.TempDir()
	e.configureLocal(t.TempDir(), storesDir, root)
	e.serve(map[string]int{scheduler.QueueIngest: 1, scheduler.QueueAppend: 1})
	if err := os.WriteFile(filepath.Join(root, "good.jsonl"), []byte(`{"text":"the quick brown fox"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	for i := range 300 {
		fmt.Fprintf(zw, `{"text":"line %d of a file that will be cut short"}`+"\n", i)
	}
	zw.Close()
	if err := os.WriteFile(filepath.Join(root, "cut.jsonl.zst"), z.Bytes()[:z.Len()/2], 0o644); err != nil {
		t.Fatal(err)
	}

	plan := func(seed uint64) string {
		t.Helper()
		id := e.enqueue(scheduler.IngestPlan{Dataset: "local:" + filepath.Join(root, "*"), Store: ingestStore, Tokenizer: ingestTokenizer, Seed: seed})
		ts := e.waitFor(id, time.Minute, "completed", state("completed"))
		e.waitDrained(time.Minute)
		return ts.Progress.Message
	}
	if msg := plan(1); !strings.Contains(msg, "2 files planned into store corpus: 2 queued, 0 already queued, 0 already appended or skipped in the store") {
		t.Fatalf("the first plan: %q", msg)
	}
	m, err := tokens.ReadManifest(filepath.Join(storesDir, ingestStore))
	if err != nil || len(m.Shards) != 1 || len(m.Skipped) != 1 {
		t.Fatalf("the store after the first plan: %+v, %v; want one file appended and the cut one skipped", m, err)
	}
	msg := plan(2)
	if !strings.Contains(msg, "2 files planned into store corpus: 0 queued, 0 already queued, 2 already appended or skipped in the store") ||
		strings.Contains(msg, "already in the store") {
		t.Fatalf("a plan again of a store that holds one file and records the other as skipped: %q", msg)
	}
}
