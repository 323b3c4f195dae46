package worker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/scheduler"
)

// A gated dataset planned with an HF_TOKEN whose account has not accepted
// its terms: the Hub lists its files, so the plan queues them all, and the
// first shards refused their download record it; the shards queued behind
// them end without asking the Hub for their file, each saying in one line
// that the dataset is gated for this token, where to accept its terms and
// that an ingest queued again plans it again. Once the terms are accepted,
// a new plan ingests the dataset.
func TestIngestOfAGatedDatasetStopsAtTheFirstRefusedShard(t *testing.T) {
	e := newIngestEnv(t)
	e.hub.Gated, e.hub.PublicListing, e.hub.Authorized = true, true, "hf_granted"
	const files, concurrency = 6, 2
	want := e.addGoodFiles("gated", files, 3, "")
	var err error
	if e.hc, err = hub.New(hub.Config{Endpoint: e.hub.Server.URL, Token: "hf_not_accepted"}); err != nil {
		t.Fatal(err)
	}
	storesDir := t.TempDir()
	e.configure(t.TempDir(), storesDir)
	e.serve(map[string]int{scheduler.QueueIngest: concurrency, scheduler.QueueAppend: 1})

	plan := scheduler.IngestPlan{Dataset: "corpus", Store: ingestStore, Tokenizer: ingestTokenizer, Seed: 3}
	id := e.enqueue(plan)
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(2 * time.Minute)

	// A shard starts once one before it ended, and a refused one records
	// the refusal before it ends: only those running at once when the
	// first was refused ask for their file.
	asked := e.hub.Downloads(0)
	if len(asked) == 0 || len(asked) > concurrency {
		t.Fatalf("downloads asked for %v: want the first shards' only, at most %d", asked, concurrency)
	}
	page := e.hc.DatasetPage(ingestRepo)
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
		if ts.State != "archived" || ts.Retried != 0 || !strings.Contains(ts.LastErr, "HF_TOKEN") || !strings.Contains(ts.LastErr, page) {
			t.Fatalf("shard of %s: %s, retried %d: %q", a.Path, ts.State, ts.Retried, ts.LastErr)
		}
		if asked[a.Path] > 0 {
			continue
		}
		stopped++
		if !strings.Contains(ts.LastErr, "is gated and this HF_TOKEN") || !strings.Contains(ts.LastErr, "sched enqueue ingest") ||
			!strings.Contains(ts.LastErr, a.Path+" was not downloaded") || strings.Contains(ts.LastErr, "\n") {
			t.Fatalf("shard of %s, never downloaded, says %q", a.Path, ts.LastErr)
		}
	}
	if shards != files || stopped != files-len(asked) {
		t.Fatalf("%d shards queued, %d ended before their download; want %d and %d", shards, stopped, files, files-len(asked))
	}

	// The terms accepted, the ingest queued again plans and ingests it all.
	e.hub.Authorize("hf_not_accepted")
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
		t.Fatalf("after the terms were accepted the store holds %d documents in %d shards, want %d in %d", len(got), len(m.Shards), len(want), files)
	}
	if a := e.archived(scheduler.QueueIngest); len(a) != 0 {
		t.Fatalf("archived after the new plan: %s", a[0].LastErr)
	}
	st, err := (&ingest.Pipeline{Objects: e.objects}).Status(context.Background(), ingestStore)
	if err != nil || st.Shards != files {
		t.Fatalf("status %+v: %v", st, err)
	}
}
