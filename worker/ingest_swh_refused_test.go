package worker

import (
	"bytes"
	"fmt"
	"testing"

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
	id, asked := e.planRefused(t, plan, concurrency)
	e.checkRefusedShards(t, files, asked, []string{"AWS_ACCESS_KEY_ID", "403 AccessDenied"}, []string{"sched enqueue ingest"})

	// The keys set, the ingest queued again plans and ingests it all. The
	// workers are idle: no shard reads the keys as they are set.
	sw.AccessKey, sw.SecretKey = "AKIDEXAMPLE", "secret"
	e.planAgainIngestsAll(t, plan, id, files, storesDir, want)
}
