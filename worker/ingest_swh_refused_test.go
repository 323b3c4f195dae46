package worker

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/scheduler"
)

type ingestBlobRow struct {
	BlobID string `parquet:"blob_id"`
}

// A dataset of Software Heritage blob ids ingested without AWS keys, where
// the bucket refuses anonymous reads: the first shards refused a blob
// record it, and the shards queued behind them end without downloading
// their file of ids from the Hub, each saying in one line to set
// AWS_ACCESS_KEY_ID and that an ingest queued again plans it again. With
// the keys set, a new plan ingests the dataset.
func TestIngestOfSoftwareHeritageBlobsWithoutKeysStopsAtTheFirstRefusedShard(t *testing.T) {
	e := newIngestEnv(t)
	swh := hubtest.NewSWH()
	t.Cleanup(swh.Close)
	swh.Private = true
	const files, concurrency = 6, 2
	var want []string
	for f := range files {
		var rows []ingestBlobRow
		for d := range 3 {
			id := fmt.Sprintf("%040x", f*10+d+1)
			s := fmt.Sprintf("blob file %d doc %d: the quick brown fox", f, d)
			swh.Add(id, []byte(s))
			rows = append(rows, ingestBlobRow{BlobID: id})
			want = append(want, s)
		}
		var buf bytes.Buffer
		w := parquet.NewGenericWriter[ingestBlobRow](&buf)
		if _, err := w.Write(rows); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		e.hub.Add(ingestRepo, fmt.Sprintf("data/blobs-%d.parquet", f), buf.Bytes(), true)
	}
	p := e.presets["corpus"]
	p.Columns = ingest.Columns{Blob: "blob_id"}
	e.presets["corpus"] = p
	storesDir := t.TempDir()
	e.configure(t.TempDir(), storesDir)
	sw := &ingest.SWH{Endpoint: swh.URL(), MaxRetries: 1}
	e.handlers.Ingest.Pipeline.SWH = sw
	e.serve(map[string]int{scheduler.QueueIngest: concurrency, scheduler.QueueAppend: 1})

	plan := scheduler.IngestPlan{Dataset: "corpus", Store: ingestStore, Tokenizer: ingestTokenizer, Seed: 3}
	id := e.enqueue(plan)
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(2 * time.Minute)

	// A shard starts once one before it ended, and a refused one records
	// the refusal before it ends: only those running at once when the
	// first was refused download their file.
	asked := e.hub.Downloads(0)
	if len(asked) == 0 || len(asked) > concurrency {
		t.Fatalf("downloads asked for %v: want the first shards' only, at most %d", asked, concurrency)
	}
	snap, err := e.c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	shards, stopped := 0, 0
	for _, ts := range snap.Tasks {
		if ts.Kind != scheduler.KindIngestShard {
			continue
		}
		shards++
		a, _ := scheduler.DecodeTask[scheduler.IngestShard](ts.Payload)
		if ts.State != "archived" || ts.Retried != 0 || !strings.Contains(ts.LastErr, "AWS_ACCESS_KEY_ID") ||
			!strings.Contains(ts.LastErr, "403 AccessDenied") || strings.Contains(ts.LastErr, "\n") {
			t.Fatalf("shard of %s: %s, retried %d: %q", a.Path, ts.State, ts.Retried, ts.LastErr)
		}
		if asked[a.Path] > 0 {
			continue
		}
		stopped++
		if !strings.Contains(ts.LastErr, a.Path+" was not downloaded") || !strings.Contains(ts.LastErr, "sched enqueue ingest") {
			t.Fatalf("shard of %s, never downloaded, says %q", a.Path, ts.LastErr)
		}
	}
	if shards != files || stopped != files-len(asked) {
		t.Fatalf("%d shards queued, %d ended before their download; want %d and %d", shards, stopped, files, files-len(asked))
	}

	// The keys set, the ingest queued again plans and ingests it all. The
	// workers are idle: no shard reads the keys as they are set.
	sw.AccessKey, sw.SecretKey = "AKIDEXAMPLE", "secret"
	before := len(e.hub.Requests())
	if _, err := e.c.Again(context.Background(), plan); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, time.Minute, "completed again", func(ts scheduler.TaskStatus) bool {
		return ts.State == "completed" && strings.Contains(ts.Progress.Message, "files planned")
	})
	e.waitDrained(2 * time.Minute)
	if got := e.hub.Downloads(before); len(got) != files {
		t.Fatalf("the new plan downloaded %v, want the %d files", got, files)
	}
	got, m := ingestStoreDocs(t, e.tok, filepath.Join(storesDir, ingestStore))
	if len(got) != len(want) || len(m.Shards) != files {
		t.Fatalf("with the keys set the store holds %d documents in %d shards, want %d in %d", len(got), len(m.Shards), len(want), files)
	}
	if a := e.archived(scheduler.QueueIngest); len(a) != 0 {
		t.Fatalf("archived after the new plan: %s", a[0].LastErr)
	}
}
