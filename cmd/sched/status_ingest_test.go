package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

// An ingest through the queue shows per dataset in `sched status`: files
// done of total, bytes done of total, tokens and rate, why it is stuck
// when no worker serves the append queue, and a file that fails listed
// under FAILURES with its reason.
func TestStatusIngestPerDataset(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	files := map[string]string{
		"a.jsonl": twoFiles["a.jsonl"],
		"b.jsonl": twoFiles["b.jsonl"],
		// Not gzip: recorded in the store as skipped, which is done.
		"c.jsonl.gz": "this is not gzip\n",
	}
	src := sourceDir(t, dir, files)
	var done int64 // bytes of the files that end up in the store or recorded as skipped
	for _, text := range files {
		done += int64(len(text))
	}
	// A second store whose directory a file blocks: its appends fail.
	os.MkdirAll(filepath.Join(data, "tokens"), 0o755)
	if err := os.WriteFile(filepath.Join(data, "tokens", "blocked"), []byte("not a store"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src}
	out, errOut, code := sched(t, env, "ingest", "local:"+filepath.Join(src, "*"), "--store", "code", "--tokenizer", "tk")
	if code != 0 {
		t.Fatalf("ingest: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = sched(t, env, "ingest", "local:"+filepath.Join(src, "b.jsonl"), "--store", "blocked", "--tokenizer", "tk")
	if code != 0 {
		t.Fatalf("ingest: exit %d\n%s%s", code, out, errOut)
	}

	// Only the ingest queue served: the shards are made, their appends wait.
	startWorker(t, env, "--queues", "ingest=1")
	stuck := regexp.MustCompile(`(?m)^code \(.*\)  files 0/3 done  .*3 waiting.*no worker serves queue append`)
	out = waitOutput(t, env, stuck, time.Minute, "status")
	if l := lineOf(out, "code ("); strings.Contains(l, "ETA") {
		t.Fatalf("a stuck dataset shows an ETA: %q", l)
	}

	startWorker(t, env, "--queues", "append=1")
	failed := regexp.MustCompile(`(?m)^\d\d:\d\d:\d\d  ingest:append:\S+  append \S*b\.jsonl to blocked  failed.*: \S`)
	waitOutput(t, env, failed, time.Minute, "status")
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^code \(.*\)  files 3/3 done  `), time.Minute, "status")
	l := lineOf(out, "code (")
	m, err := tokens.ReadManifest(filepath.Join(data, "tokens", "code"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{formatBytes(done) + " of ", formatCount(m.Tokens, "tok")} {
		if !strings.Contains(l, want) {
			t.Fatalf("dataset line %q lacks %q (store holds %d tokens)", l, want, m.Tokens)
		}
	}
	// The file recorded as skipped is done, and said not to be in the
	// store: its bytes count as read, and a store of such files alone
	// read as filled.
	if !regexp.MustCompile(`  1 skipped, not in the store \([a-z-]+=1; 'sched datasets' says why\)`).MatchString(l) {
		t.Fatalf("dataset line %q does not say that one file was skipped, and why", l)
	}
	// A rate in bytes a second, in whatever unit its size takes.
	if !regexp.MustCompile(`  \d[\d.]* [kMGT]?B/s(  |$)`).MatchString(l) {
		t.Fatalf("dataset line %q lacks its rate in bytes a second", l)
	}

	q := scheduler.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	defer q.Close()
	snap, err := q.Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ds := snap.Datasets()
	if len(ds) != 2 || ds[0].Store != "blocked" || ds[1].Store != "code" {
		t.Fatalf("datasets %+v; want stores blocked and code", ds)
	}
	if b := ds[0]; b.Files != 1 || b.Done != 0 {
		t.Fatalf("store blocked: %+v; want its one file not done", b)
	}
	// A run of store code lacks nothing; one of blocked waits (its append
	// retries: nothing failed for good yet).
	if failed, err := q.FailedIngests(context.Background()); err != nil || failed["code"].Failed != 0 || failed["code"].PlanFailed {
		t.Errorf("FailedIngests: code %+v, %v; want none", failed["code"], err)
	}
	if n, err := q.LiveIngest(context.Background(), "blocked"); err != nil || n != 1 {
		t.Errorf("LiveIngest(blocked) = %d, %v; want its one append", n, err)
	}
	d := ds[1]
	if d.Files != 3 || d.Done != 3 || d.Remaining() != 0 || !d.SizesKnown || d.DoneBytes != done || d.Bytes != done ||
		d.Tokens != m.Tokens || d.Planning || d.Started.IsZero() || d.Last.Before(d.Started.Truncate(time.Second)) {
		t.Fatalf("dataset %+v; want store code, 3 files done: %d bytes, %d tokens", d, done, m.Tokens)
	}
	// The rate of a finished dataset is its bytes over the time from its
	// first file's start to its last file's end, and it has no ETA.
	if want := float64(done) / d.Last.Sub(d.Started).Seconds(); d.Rate != want || d.ETA != 0 || !strings.Contains(l, "  done") {
		t.Fatalf("rate %v ETA %v (line %q); want %v bytes/s, done", d.Rate, d.ETA, l, want)
	}
}

// A store's files whose tasks failed an attempt and wait for their retry
// read as retrying, pointing at FAILURES, not as waiting their turn.
func TestADatasetsFilesRetryingAfterAFailureSaySo(t *testing.T) {
	d := scheduler.DatasetProgress{Store: "code", Files: 5, Done: 2, Retrying: 2, Waiting: 1}
	line := datasetLine(d, &scheduler.Snapshot{}, time.Time{})
	if !strings.Contains(line, "2 retrying after a failed attempt (FAILURES says why)") || !strings.Contains(line, "1 waiting") {
		t.Fatalf("a store with files retrying: %q; want 2 retrying and 1 waiting", line)
	}
}
