package worker

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

// waitUntil polls cond until it holds; false if the request ends or a
// minute passes first (a test that is broken, not slow).
func waitUntil(ctx context.Context, cond func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(5 * time.Millisecond):
		}
	}
	return true
}

// Once an append refused a shard at the ingest's --max-tokens or
// --max-disk, the store is full at that limit: the shards of the dataset
// that start after the refusal complete as stopped without downloading
// their file, the one whose download was under way as stopped before it
// was tokenized, and a plan under the limit, or a lower one, stops at once.
// The store's files and status stay as the refusal left them, and a larger
// limit appends the files left out after those in, which do not change.
func TestIngestReadsNoMoreFilesOnceTheStoreIsFull(t *testing.T) {
	e := newIngestEnv(t)
	// watch(hold, until) starts a record of the downloads: the hold-th
	// file first downloaded from then on waits for until (hold 0: none
	// waits); downloaded() is the files downloaded since.
	var mu sync.Mutex
	seen := map[string]bool{}
	var hold, from int
	var until func() bool
	watch := func(h int, u func() bool) {
		mu.Lock()
		defer mu.Unlock()
		seen, hold, until, from = map[string]bool{}, h, u, len(e.hub.Requests())
	}
	downloaded := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		return e.hub.Downloads(from)
	}
	e.hub.SetBeforeResolve(func(ctx context.Context, _, path string) error {
		mu.Lock()
		var wait func() bool
		if !seen[path] {
			seen[path] = true
			if len(seen) == hold {
				wait = until
			}
		}
		mu.Unlock()
		if wait != nil && !waitUntil(ctx, wait) {
			t.Errorf("the download of %s waited in vain", path)
			return errors.New("the test's condition never came")
		}
		return nil
	})
	const files = 8
	e.addGoodFiles("good", files, 4, strings.Repeat(" and more text", 20))
	storesDir := t.TempDir()
	e.configure(t.TempDir(), storesDir)
	// One shard at a time, in the plan's order: the shards after the one
	// held start after the refusal.
	e.serve(map[string]int{scheduler.QueueIngest: 1, scheduler.QueueAppend: 1})
	ctx := context.Background()
	status := ingest.Pipeline{Objects: e.objects}

	perFile := e.fileTokens(storesDir)

	for _, c := range []struct {
		name, flag, refusal string
		limits, lower       ingest.Limits
	}{
		// An eighth of a file is less than one of its 4 documents: the
		// third file cannot go in part.
		{"tokens", "--max-tokens", "would pass --max-tokens", ingest.Limits{MaxTokens: 2*perFile + perFile/8}, ingest.Limits{MaxTokens: 2*perFile + 1}},
		{"disk", "--max-disk", "past --max-disk", ingest.Limits{MaxDisk: 2*perFile*2 + perFile/4}, ingest.Limits{MaxDisk: 2*perFile*2 + 1}},
	} {
		full := func() bool {
			st, err := status.Status(ctx, c.name)
			return err == nil && st.Full != ingest.Limits{}
		}
		// The fourth file's shard starts once the third's has queued its
		// append, which the store refuses: should it download its file
		// before the refusal, the download waits for it. The fifth to
		// eighth files' shards start after the refusal.
		watch(4, full)
		plan := scheduler.IngestPlan{Dataset: "corpus", Store: c.name, Tokenizer: ingestTokenizer, Limits: c.limits}
		id := e.enqueue(plan)
		e.waitFor(id, time.Minute, "completed", state("completed"))
		e.waitDrained(2 * time.Minute)

		storeDir := filepath.Join(storesDir, c.name)
		m, err := tokens.ReadManifest(storeDir)
		if err != nil || len(m.Shards) != 2 || m.Tokens != 2*perFile {
			t.Fatalf("%s: manifest %+v, %v; want two files of %d tokens", c.name, m, err, perFile)
		}
		st, err := status.Status(ctx, c.name)
		if err != nil || st.Full != c.limits || st.Tokens != m.Tokens || st.Shards != 2 {
			t.Fatalf("%s: status %+v, %v; want full at %+v", c.name, st, err, c.limits)
		}
		snap, err := e.c.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var done, refused, notTokenized, notRead []string
		for _, ts := range snap.Tasks {
			var file string
			switch ts.Kind {
			case scheduler.KindIngestShard:
				a, _ := scheduler.DecodeTask[scheduler.IngestShard](ts.Payload)
				if a.Store != c.name {
					continue
				}
				file = a.Path
			case scheduler.KindIngestAppend:
				a, _ := scheduler.DecodeTask[scheduler.IngestAppend](ts.Payload)
				if a.Store != c.name {
					continue
				}
				file = a.Source
			default:
				continue
			}
			msg := ts.Progress.Message
			switch {
			case ts.State != "completed" || ts.LastErr != "":
				t.Fatalf("%s: %s of %s is %s: %q", c.name, ts.Kind, file, ts.State, ts.LastErr)
			case ts.Progress.State != "stopped":
				if ts.Kind == scheduler.KindIngestAppend {
					done = append(done, file)
				}
			case !strings.Contains(msg, "store "+c.name+" stopped") || !strings.Contains(msg, c.flag):
				t.Fatalf("%s: stopped %s says %q", c.name, ts.Kind, msg)
			case ts.Kind == scheduler.KindIngestAppend && strings.Contains(msg, c.refusal):
				refused = append(refused, file)
			case ts.Kind == scheduler.KindIngestShard && strings.Contains(msg, file+" was downloaded but not tokenized"):
				notTokenized = append(notTokenized, file)
			case ts.Kind == scheduler.KindIngestShard && strings.Contains(msg, file+" was not read") && strings.Contains(msg, "full at "+c.flag):
				notRead = append(notRead, file)
			default:
				t.Fatalf("%s: %s of %s stopped with %q", c.name, ts.Kind, file, msg)
			}
		}
		if len(done) != 2 || len(refused) != 1 || len(notTokenized)+len(notRead) != files-3 || len(notTokenized) > 1 {
			t.Fatalf("%s: %d appended, %d refused at their append, %d stopped before tokenizing, %d before reading; want 2, 1, and %d stopped (at most the fourth before tokenizing)",
				c.name, len(done), len(refused), len(notTokenized), len(notRead), files-3)
		}
		got := downloaded()
		for _, f := range slices.Concat(done, refused, notTokenized) {
			if got[f] != 1 {
				t.Fatalf("%s: %s downloaded %d times, want once", c.name, f, got[f])
			}
		}
		for _, f := range notRead {
			if got[f] != 0 {
				t.Fatalf("%s: %s was downloaded after the store was full", c.name, f)
			}
		}
		if len(got) != 3+len(notTokenized) {
			t.Fatalf("%s: %d files downloaded, want %d: %v", c.name, len(got), 3+len(notTokenized), got)
		}
		if left, _ := e.objects.List(ctx, ingest.ShardPrefix(c.name)); len(left) != 0 {
			t.Fatalf("%s: shards left in object storage: %v", c.name, left)
		}
		for _, d := range snap.Datasets() {
			if d.Store == c.name && (d.Done != 2 || d.Stopped != files-2 || d.Failed != 0 || d.StoppedAt != c.limits) {
				t.Fatalf("%s: dataset %+v; want 2 files done and %d stopped at %+v", c.name, d, files-2, c.limits)
			}
		}
		before, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
		if err != nil {
			t.Fatal(err)
		}

		// A plan under the same limit (another seed: another task), or a
		// lower one, stops at once: nothing is downloaded or appended.
		watch(0, nil)
		for _, p := range []scheduler.IngestPlan{{Seed: 1, Limits: c.limits}, {Limits: c.lower}} {
			p.Dataset, p.Store, p.Tokenizer = "corpus", c.name, ingestTokenizer
			ts := e.waitFor(e.enqueue(p), time.Minute, "completed", state("completed"))
			if ts.Progress.State != "stopped" || !strings.Contains(ts.Progress.Message, "full at "+c.flag) {
				t.Fatalf("%s: plan at %+v of the full store: %+v", c.name, p.Limits, ts.Progress)
			}
		}
		e.waitDrained(time.Minute)
		if got := downloaded(); len(got) != 0 {
			t.Fatalf("%s: a plan of the full store downloaded %v", c.name, got)
		}
		if m2, err := tokens.ReadManifest(storeDir); err != nil || m2.Tokens != m.Tokens || len(m2.Shards) != 2 {
			t.Fatalf("%s: the full store changed: %+v, %v", c.name, m2, err)
		}

		// A larger limit appends the six files left out after the two in,
		// and the store is no longer marked full.
		plan.Limits = ingest.Limits{MaxTokens: 10 * perFile}
		id = e.enqueue(plan)
		ts := e.waitFor(id, time.Minute, "completed", state("completed"))
		if !strings.Contains(ts.Progress.Message, "6 queued") || !strings.Contains(ts.Progress.Message, "2 already appended or skipped in the store") {
			t.Fatalf("%s: plan at a larger limit: %q", c.name, ts.Progress.Message)
		}
		e.waitDrained(2 * time.Minute)
		m2, err := tokens.ReadManifest(storeDir)
		if err != nil || len(m2.Shards) != files || m2.Tokens != files*perFile || m2.Shards[0] != m.Shards[0] || m2.Shards[1] != m.Shards[1] {
			t.Fatalf("%s: after the larger limit: %+v, %v; want %d files, the first two unchanged", c.name, m2, err, files)
		}
		after, err := os.ReadFile(filepath.Join(storeDir, tokens.TokensFile))
		if err != nil || !bytes.Equal(after[:len(before)], before) {
			t.Fatalf("%s: the tokens in before the larger limit changed (%v)", c.name, err)
		}
		if st, err := status.Status(ctx, c.name); err != nil || st.Full != (ingest.Limits{}) || st.Tokens != m2.Tokens {
			t.Fatalf("%s: status after the larger limit: %+v, %v", c.name, st, err)
		}
	}
	if a := e.archived(scheduler.QueueAppend); len(a) != 0 {
		t.Fatalf("an append was archived: %s", a[0].LastErr)
	}
	if a := e.archived(scheduler.QueueIngest); len(a) != 0 {
		t.Fatalf("an ingest task was archived: %s", a[0].LastErr)
	}
}
