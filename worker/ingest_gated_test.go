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
	id, asked := e.planRefused(t, plan, concurrency)
	page := e.hc.DatasetPage(ingestRepo)
	e.checkRefusedShards(t, files, asked, []string{"HF_TOKEN", page}, []string{"is gated and this HF_TOKEN", "sched enqueue ingest"})

	// The terms accepted, the ingest queued again plans and ingests it all.
	e.hub.Authorize("hf_not_accepted")
	e.planAgainIngestsAll(t, plan, id, files, storesDir, want)
	st, err := (&ingest.Pipeline{Objects: e.objects}).Status(context.Background(), ingestStore)
	if err != nil || st.Shards != files {
		t.Fatalf("status %+v: %v", st, err)
	}
}

// planRefused plans the dataset into the store and waits for every task to
// end; only the shards running at once when the first was refused may ask
// the Hub for their file (a shard starts once one before it ended, and a
// refused one records the refusal before it ends). It returns the plan's
// task id and the downloads asked for.
func (e *ingestEnv) planRefused(t *testing.T, plan scheduler.IngestPlan, concurrency int) (string, map[string]int) {
	t.Helper()
	id := e.enqueue(plan)
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(2 * time.Minute)
	asked := e.hub.Downloads(0)
	if len(asked) == 0 || len(asked) > concurrency {
		t.Fatalf("downloads asked for %v: want the first shards' only, at most %d", asked, concurrency)
	}
	return id, asked
}

// checkRefusedShards checks that each of the files' shards was archived at
// once in one line holding every word of all, and that those that asked
// for no download ended before it, saying so and holding every word of
// stopped too.
func (e *ingestEnv) checkRefusedShards(t *testing.T, files int, asked map[string]int, all, stopped []string) {
	t.Helper()
	snap, err := e.c.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	holds := func(msg string, words []string) bool {
		for _, w := range words {
			if !strings.Contains(msg, w) {
				return false
			}
		}
		return true
	}
	shards, ended := 0, 0
	for _, ts := range snap.Tasks {
		if ts.Kind != scheduler.KindIngestShard {
			continue
		}
		shards++
		a, _ := scheduler.DecodeTask[scheduler.IngestShard](ts.Payload)
		if ts.State != "archived" || ts.Retried != 0 || !holds(ts.LastErr, all) || strings.Contains(ts.LastErr, "\n") {
			t.Fatalf("shard of %s: %s, retried %d: %q", a.Path, ts.State, ts.Retried, ts.LastErr)
		}
		if asked[a.Path] > 0 {
			continue
		}
		ended++
		if !holds(ts.LastErr, append([]string{a.Path + " was not downloaded"}, stopped...)) {
			t.Fatalf("shard of %s, never downloaded, says %q", a.Path, ts.LastErr)
		}
	}
	if shards != files || ended != files-len(asked) {
		t.Fatalf("%d shards queued, %d ended before their download; want %d and %d", shards, ended, files, files-len(asked))
	}
}

// planAgainIngestsAll queues the plan again and checks that it downloads
// every file and the store ends holding want, nothing archived.
func (e *ingestEnv) planAgainIngestsAll(t *testing.T, plan scheduler.IngestPlan, id string, files int, storesDir string, want []string) {
	t.Helper()
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
		t.Fatalf("after the new plan the store holds %d documents in %d shards, want %d in %d", len(got), len(m.Shards), len(want), files)
	}
	if a := e.archived(scheduler.QueueIngest); len(a) != 0 {
		t.Fatalf("archived after the new plan: %s", a[0].LastErr)
	}
}
