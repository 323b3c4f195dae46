package worker

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/klauspost/compress/zstd"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/parquet-go/parquet-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sync/semaphore"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

const (
	ingestRepo      = "owner/corpus"
	ingestTokenizer = "ingest-test-bpe"
	ingestStore     = "corpus"
)

// The test binary doubles as an ingest worker process: with
// KILN_TEST_INGEST_WORKER set to queues ("append=1") it serves them with the
// ingest handlers until SIGTERM, so that a test can SIGKILL a real appender
// and a benchmark can read a real worker's peak RSS. init runs before
// TestMain.
func init() {
	if os.Getenv("KILN_TEST_INGEST_WORKER") == "" {
		return
	}
	os.Exit(runIngestChild())
}

func runIngestChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, err); return 1 }
	queues, err := ParseQueues(os.Getenv("KILN_TEST_INGEST_WORKER"))
	if err != nil {
		return fail(err)
	}
	opt, err := asynq.ParseRedisURI(os.Getenv("KILN_TEST_REDIS_URL"))
	if err != nil {
		return fail(err)
	}
	var st store.Store
	if dir := os.Getenv("KILN_TEST_OBJECTS_DIR"); dir != "" {
		st, err = store.NewLocal(dir)
	} else {
		// KILN_TEST_S3_PART_SIZE: the benchmark's part size experiments;
		// unset or unreadable, the store's default.
		part, _ := strconv.ParseUint(os.Getenv("KILN_TEST_S3_PART_SIZE"), 10, 64)
		st, err = store.NewS3(store.S3Options{Endpoint: os.Getenv("KILN_TEST_S3_ENDPOINT"), Bucket: "kiln",
			AccessKey: os.Getenv("KILN_TEST_S3_ACCESS"), SecretKey: os.Getenv("KILN_TEST_S3_SECRET"), PartSize: part})
	}
	if err != nil {
		return fail(err)
	}
	if d, err := time.ParseDuration(os.Getenv("KILN_TEST_READ_DELAY")); err == nil && d > 0 {
		st = ingestSlowReads{st, d}
	}
	log, _ := zap.NewDevelopment()
	if os.Getenv("KILN_TEST_QUIET") != "" {
		log = zap.NewNop()
	}
	c := scheduler.NewClient(opt)
	defer c.Close()
	// A benchmark can set how far a parquet file is decoded ahead.
	ahead, _ := strconv.ParseInt(os.Getenv("KILN_TEST_DECODE_AHEAD"), 10, 64)
	// and how many shards tokenize at once (default ingest.DefaultTokenizing()).
	var tokenizing *semaphore.Weighted
	if n, err := strconv.ParseInt(os.Getenv("KILN_TEST_TOKENIZING"), 10, 64); err == nil && n > 0 {
		tokenizing = semaphore.NewWeighted(n)
	}
	// and the largest shard an append reads before it takes the store.
	prefetch, _ := strconv.ParseInt(os.Getenv("KILN_TEST_PREFETCH"), 10, 64)
	// and the encoding pool's size (default ingest.DefaultEncoders()).
	if n, err := strconv.Atoi(os.Getenv("KILN_TEST_ENCODERS")); err == nil && n > 0 {
		ingest.SetEncoders(n)
	}
	// and how long an append waits for a store another process holds,
	// and how soon one set back to wait looks again (default: a worker's).
	storeWait, _ := time.ParseDuration(os.Getenv("KILN_TEST_STORE_WAIT"))
	waitEvery, _ := time.ParseDuration(os.Getenv("KILN_TEST_WAIT_EVERY"))
	ing := &Ingest{
		Pipeline: ingest.Pipeline{Objects: st, StoresDir: os.Getenv("KILN_TEST_STORES"), DataDir: os.Getenv("KILN_TEST_DATA"), Logger: log,
			DecodeAhead: ahead, Tokenizing: tokenizing, Prefetch: prefetch, LocalRoots: filepath.SplitList(os.Getenv("KILN_TEST_LOCAL_ROOTS")),
			StoreWait: storeWait},
		Enqueue:   func(ctx context.Context, a scheduler.Args) error { _, err := c.Again(ctx, a); return err },
		WaitEvery: waitEvery,
	}
	// Tests watch progress as it happens; a benchmark sets the production
	// throttle instead, so that it measures what a worker does.
	every := time.Millisecond
	if v, err := time.ParseDuration(os.Getenv("KILN_TEST_PROGRESS_EVERY")); err == nil {
		every = v
	}
	w, err := New(Params{Redis: opt, Queues: queues, ShutdownGrace: 10 * time.Second, Handlers: Handlers{Ingest: ing},
		Logger: log, DelayedTaskCheckInterval: 200 * time.Millisecond, ProgressEvery: every})
	if err != nil {
		return fail(err)
	}
	// A benchmark can record the worker: a CPU profile, an execution trace.
	for _, rec := range []struct {
		env   string
		start func(io.Writer) error
		stop  func()
	}{{"KILN_TEST_CPUPROFILE", pprof.StartCPUProfile, pprof.StopCPUProfile}, {"KILN_TEST_TRACE", trace.Start, trace.Stop}} {
		path := os.Getenv(rec.env)
		if path == "" {
			continue
		}
		f, err := os.Create(path)
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := rec.start(f); err != nil {
			return fail(err)
		}
		defer rec.stop()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

// ingestSlowReads is the S3 store with reads paced to 64 KiB per delay, so that
// an append lasts long enough to be killed in the middle. Every byte still
// comes from the S3 server.
type ingestSlowReads struct {
	store.Store
	delay time.Duration
}

func (s ingestSlowReads) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	r, err := s.Store.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return &ingestSlowReader{r, s.delay}, nil
}

type ingestSlowReader struct {
	io.ReadCloser
	delay time.Duration
}

func (r *ingestSlowReader) Read(b []byte) (int, error) {
	time.Sleep(r.delay)
	return r.ReadCloser.Read(b[:min(len(b), 64<<10)])
}

// ingestEnv is a queue on a real Redis, an object store on a real
// versitygw, a fake hub, and a published tokenizer.
type ingestEnv struct {
	*env
	s3      *testsvc.S3Server
	objects store.Store
	hub     *hubtest.Hub
	hc      *hub.Client
	tok     *tokenizer.Tokenizer
	presets map[string]ingest.Preset
	// logger receives the workers' logs (nil: none).
	logger *zap.Logger
}

func newIngestEnv(t *testing.T) *ingestEnv {
	e := &ingestEnv{env: newEnv(t), s3: testsvc.S3(t), hub: hubtest.New()}
	t.Cleanup(e.hub.Close)
	var err error
	if e.objects, err = store.NewS3(store.S3Options{Endpoint: e.s3.Endpoint, Bucket: "kiln", AccessKey: e.s3.AccessKey, SecretKey: e.s3.SecretKey}); err != nil {
		t.Fatal(err)
	}
	if e.hc, err = hub.New(hub.Config{Endpoint: e.hub.Server.URL}); err != nil {
		t.Fatal(err)
	}
	corpus := strings.Repeat("package main\nfunc main() { fmt.Println(\"hello, world\") }\nthe quick brown fox jumps over the lazy dog\n", 200)
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(corpus)}, tokenizer.TrainOptions{VocabSize: 320})
	if err != nil {
		t.Fatal(err)
	}
	if e.tok, err = tokenizer.Parse(b); err != nil {
		t.Fatal(err)
	}
	// Published from a machine of its own: workers find it by name.
	if _, err := catalog.New(e.objects, t.TempDir()).Publish(context.Background(), ingestTokenizer, b); err != nil {
		t.Fatal(err)
	}
	e.presets = map[string]ingest.Preset{"corpus": {Name: "corpus", Repo: ingestRepo, Revision: "main",
		Include: []string{"data/*", "data/*/*/*/*/*"}, Columns: ingest.Columns{Text: "text"}}}
	return e
}

// A plan whose Hub answers 503 says so in its task's message while it
// waits, after the dataset it lists; once the Hub is back it plans.
func TestAPlanSaysItWaitsForTheHub(t *testing.T) {
	e := newIngestEnv(t)
	e.addGoodFiles("a", 2, 3, "")
	e.hub.SetUnavailable(1<<30, 1)
	var err error
	if e.hc, err = hub.New(hub.Config{Endpoint: e.hub.Server.URL, MaxRetries: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	e.configure(t.TempDir(), t.TempDir())
	e.serve(map[string]int{scheduler.QueueIngest: 1})
	id := e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: "waits", Tokenizer: ingestTokenizer})
	e.waitFor(id, time.Minute, "saying it waits for the Hub", func(ts scheduler.TaskStatus) bool {
		return ts.State == "active" && regexp.MustCompile(`^listing corpus: .* answered 503 Service Unavailable; trying again in 1s \(attempt \d+ of \d+\)$`).MatchString(ts.Progress.Message)
	})
	e.hub.SetUnavailable(0, 0)
	if ts := e.waitFor(id, time.Minute, "completed", state("completed")); !strings.Contains(ts.Progress.Message, "2 files planned into store waits") {
		t.Fatalf("the plan once the Hub is back: %q", ts.Progress.Message)
	}
}

// configure sets the ingest handlers of the workers serve starts: a data
// directory of their own, and stores (for the append queue) or none.
func (e *ingestEnv) configure(dataDir, storesDir string) {
	e.handlers.Ingest = &Ingest{
		Pipeline: ingest.Pipeline{Objects: e.objects, Hub: e.hc, Presets: e.presets, DataDir: dataDir, StoresDir: storesDir, Logger: zap.NewNop()},
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Again(ctx, a); return err },
	}
}

// serve runs an in-process worker on queues until the test ends.
func (e *ingestEnv) serve(queues map[string]int) {
	ctx, cancel := context.WithCancel(context.Background())
	log := e.logger
	if log == nil {
		log = zap.NewNop()
	}
	w, err := New(Params{Redis: e.opt, Queues: queues, Handlers: e.handlers, Logger: log, DelayedTaskCheckInterval: 200 * time.Millisecond, ProgressEvery: time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

type ingestRow struct {
	Text string `parquet:"text"`
}

func ingestParquet(t *testing.T, texts []string) []byte {
	t.Helper()
	var buf bytes.Buffer
	rows := make([]ingestRow, len(texts))
	for i, s := range texts {
		rows[i] = ingestRow{s}
	}
	w := parquet.NewGenericWriter[ingestRow](&buf, parquet.MaxRowsPerRowGroup(4))
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// addGoodFiles adds n parquet files of docs documents each, every file with
// one document of invalid UTF-8 as well, and returns the valid documents.
func (e *ingestEnv) addGoodFiles(prefix string, n, docs int, filler string) []string {
	var want []string
	for f := range n {
		var texts []string
		for d := range docs {
			s := fmt.Sprintf("%s file %d doc %d: the quick brown fox%s", prefix, f, d, filler)
			texts = append(texts, s)
			want = append(want, s)
		}
		texts = append(texts, "bad \xff utf8")
		e.hub.Add(ingestRepo, fmt.Sprintf("data/%s-%d.parquet", prefix, f), ingestParquet(e.t, texts), true)
	}
	return want
}

// fileTokens is one file's tokens (the datasets' files have equal counts),
// measured through the queue on a store of its own, "one", in storesDir.
func (e *ingestEnv) fileTokens(storesDir string) int64 {
	e.t.Helper()
	id := e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: "one", Tokenizer: ingestTokenizer, MaxFiles: 1})
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(time.Minute)
	one, err := tokens.ReadManifest(filepath.Join(storesDir, "one"))
	if err != nil || len(one.Shards) != 1 {
		e.t.Fatalf("one-file store: %v", err)
	}
	return one.Tokens
}

// addBadFiles adds one file for each way a file is skipped whole.
func (e *ingestEnv) addBadFiles() {
	good := ingestParquet(e.t, []string{"x"})
	e.hub.Add(ingestRepo, "data/corrupt.parquet", append([]byte("not parquet at all"), good[len(good)-8:]...), true)
	e.hub.Add(ingestRepo, "data/empty.parquet", nil, false)
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	for i := range 500 {
		fmt.Fprintf(zw, `{"text":"line %d of a file that will be cut short"}`+"\n", i)
	}
	zw.Close()
	e.hub.Add(ingestRepo, "data/truncated.jsonl.zst", z.Bytes()[:z.Len()/2], true)
	e.hub.Add(ingestRepo, "data/x/../../../escape.parquet", good, false)
}

// waitDrained waits until the ingest and append queues hold no waiting,
// running or retrying task: every step the plan started has run.
func (e *ingestEnv) waitDrained(within time.Duration) {
	e.t.Helper()
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	deadline := time.Now().Add(within)
	for {
		busy := 0
		var last string
		for _, q := range []string{scheduler.QueueIngest, scheduler.QueueAppend} {
			qi, err := insp.GetQueueInfo(q)
			if err != nil {
				continue // a queue nothing was ever enqueued to
			}
			busy += qi.Pending + qi.Active + qi.Scheduled + qi.Retry
			if qi.Retry > 0 {
				ts, _ := insp.ListRetryTasks(q)
				for _, t := range ts {
					last = t.LastErr
				}
			}
		}
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("queues not drained within %v: %d tasks busy; last retry error %q", within, busy, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *ingestEnv) archived(q string) []*asynq.TaskInfo {
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	ts, _ := insp.ListArchivedTasks(q)
	return ts
}

// ingestStoreDocs decodes a store's committed tokens into its documents.
func ingestStoreDocs(t *testing.T, tok *tokenizer.Tokenizer, dir string) ([]string, *tokens.Manifest) {
	t.Helper()
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, tokens.TokensFile))
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	var docs []string
	var ids []uint32
	for i := range m.Tokens {
		id := uint32(binary.LittleEndian.Uint16(b[2*i:]))
		if id != eos {
			ids = append(ids, id)
			continue
		}
		s, err := tok.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, s)
		ids = ids[:0]
	}
	return docs, m
}

func ingestFilesUnder(t *testing.T, dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// Plan, shards and appends end to end through the queue: each shard worker
// download lands in the worker's own data directory, shards travel only
// through object storage, the append worker alone holds the store, and
// every file that cannot be read is reported, counted and left out.
func TestIngestThroughTheQueue(t *testing.T) {
	e := newIngestEnv(t)
	want := e.addGoodFiles("good", 4, 5, "")
	e.addBadFiles()
	e.hub.BreakOnce, e.hub.RateLimited = true, 2
	shardData, storesDir := t.TempDir(), t.TempDir()
	e.configure(shardData, storesDir)
	// Two appends at once, as a worker serves them: one reads its shard
	// while the other commits, and every shard still goes in exactly once.
	e.serve(map[string]int{scheduler.QueueIngest: 2, scheduler.QueueAppend: 2})

	plan := scheduler.IngestPlan{Dataset: "corpus", Store: ingestStore, Tokenizer: ingestTokenizer, Seed: 7}
	id := e.enqueue(plan)
	ts := e.waitFor(id, time.Minute, "completed", state("completed"))
	if !strings.Contains(ts.Progress.Message, "8 files planned") || !strings.Contains(ts.Progress.Message, "8 queued") {
		t.Fatalf("plan progress: %q", ts.Progress.Message)
	}
	e.waitDrained(2 * time.Minute)

	got, m := ingestStoreDocs(t, e.tok, filepath.Join(storesDir, ingestStore))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("the store holds %d documents, want each of %d exactly once:\n got %q\nwant %q", len(got), len(want), got, want)
	}
	if len(m.Shards) != 4 {
		t.Fatalf("%d shards appended, want 4", len(m.Shards))
	}
	for _, s := range m.Shards {
		if s.Revision != e.hub.Commit {
			t.Errorf("shard %s records revision %q, want the resolved commit %s", s.ID, s.Revision, e.hub.Commit)
		}
	}
	files, docs := ingest.Skips{}, ingest.Skips{}
	for _, s := range m.Skipped {
		reason, _, _ := strings.Cut(s.Reason, ":")
		if s.Count == 0 {
			files.Add(reason, 1)
		} else {
			docs.Add(reason, s.Count)
		}
	}
	wantFiles := ingest.Skips{ingest.SkipCorruptFile: 2, ingest.SkipEmptyFile: 1, ingest.SkipUnsafePath: 1}
	if files.String() != wantFiles.String() || docs.String() != (ingest.Skips{ingest.SkipInvalidUTF8: 4}).String() {
		t.Fatalf("skipped files %v (want %v), documents %v (want invalid-utf8=4); manifest: %+v", files, wantFiles, docs, m.Skipped)
	}

	// Each skipped file is reported by its shard task, with the reason.
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	done, err := insp.ListCompletedTasks(scheduler.QueueIngest)
	if err != nil {
		t.Fatal(err)
	}
	reported := map[string]bool{}
	for _, ti := range done {
		if ts, err := e.c.Task(context.Background(), ti.ID); err == nil {
			reported[ts.Progress.Message] = true
		}
	}
	for _, want := range []string{"data/corrupt.parquet: skipped (corrupt-file)", "data/truncated.jsonl.zst: skipped (corrupt-file)",
		"data/empty.parquet: skipped (empty-file)", "data/x/../../../escape.parquet: skipped (unsafe-path)", "skipped documents: invalid-utf8=1"} {
		found := false
		for msg := range reported {
			found = found || strings.Contains(msg, want)
			if strings.Count(msg, "skipped (") > 1 {
				t.Errorf("a shard task's report names its skip twice: %q", msg)
			}
		}
		if !found {
			t.Errorf("no shard task reported %q; reports: %q", want, slices.Collect(maps.Keys(reported)))
		}
	}

	// Nothing waits in object storage or in the shard worker's directory.
	left, err := e.objects.List(context.Background(), ingest.ShardPrefix(ingestStore))
	if err != nil || len(left) != 0 {
		t.Fatalf("shard objects left: %v %v", left, err)
	}
	for _, sub := range []string{"raw", "shards"} {
		if f := ingestFilesUnder(t, filepath.Join(shardData, sub)); len(f) != 0 {
			t.Fatalf("files left in the shard worker's %s: %v", sub, f)
		}
	}
	if f := ingestFilesUnder(t, filepath.Join(storesDir, "..", "escape.parquet")); len(f) != 0 {
		t.Fatalf("the escaping path was written: %v", f)
	}
	pipe := ingest.Pipeline{Objects: e.objects}
	st, err := pipe.Status(context.Background(), ingestStore)
	if err != nil || st.Tokens != m.Tokens || st.Shards != 4 || len(st.Done) != 8 {
		t.Fatalf("published status %+v (%v); manifest has %d tokens", st, err, m.Tokens)
	}

	// A new plan queues only what the store lacks: one new file.
	more := e.addGoodFiles("late", 1, 3, "")
	plan.Seed = 8
	id = e.enqueue(plan)
	ts = e.waitFor(id, time.Minute, "completed", state("completed"))
	if !strings.Contains(ts.Progress.Message, "9 files planned") || !strings.Contains(ts.Progress.Message, "1 queued") ||
		!strings.Contains(ts.Progress.Message, "8 already appended or skipped in the store") {
		t.Fatalf("re-plan progress: %q", ts.Progress.Message)
	}
	e.waitDrained(time.Minute)
	got, m2 := ingestStoreDocs(t, e.tok, filepath.Join(storesDir, ingestStore))
	if len(got) != len(want)+len(more) || len(m2.Shards) != 5 || m2.Shards[4].Offset != m.Tokens {
		t.Fatalf("after the re-plan: %d documents, %d shards", len(got), len(m2.Shards))
	}
	if a := e.archived(scheduler.QueueAppend); len(a) != 0 {
		t.Fatalf("archived appends: %s", a[0].LastErr)
	}
}

// --max-tokens and --max-disk stop an ingest through the queue before the
// store passes them, as its planned end: the appends that would pass, and
// the shards that start once one was refused, complete (progress state
// "stopped") with the limit named, logged at info, the shards are dropped,
// and a plan against a full store completes the same way; nothing is
// archived or retried.
func TestIngestStopsAtLimits(t *testing.T) {
	e := newIngestEnv(t)
	core, logs := observer.New(zap.InfoLevel)
	e.logger = zap.New(core)
	e.addGoodFiles("good", 6, 4, strings.Repeat(" and more text", 20))
	storesDir := t.TempDir()
	e.configure(t.TempDir(), storesDir)
	e.serve(map[string]int{scheduler.QueueIngest: 2, scheduler.QueueAppend: 1})

	perFile := e.fileTokens(storesDir)

	for _, c := range []struct {
		name string
		plan scheduler.IngestPlan
		flag string
		room func(m *tokens.Manifest) bool
	}{
		// An eighth of a file is less than one of its 4 documents: no file
		// goes in part here (ingest's tests take files in part).
		{"tokens", scheduler.IngestPlan{Limits: ingest.Limits{MaxTokens: perFile*2 + perFile/8}}, "--max-tokens", func(m *tokens.Manifest) bool { return m.Tokens <= perFile*2+perFile/8 }},
		{"disk", scheduler.IngestPlan{Limits: ingest.Limits{MaxDisk: perFile*2*3 + 1}}, "--max-disk", func(m *tokens.Manifest) bool { return m.Tokens*2 <= perFile*2*3+1 }},
	} {
		p := c.plan
		p.Dataset, p.Store, p.Tokenizer = "corpus", c.name, ingestTokenizer
		id := e.enqueue(p)
		e.waitFor(id, time.Minute, "completed", state("completed"))
		e.waitDrained(2 * time.Minute)
		m, err := tokens.ReadManifest(filepath.Join(storesDir, c.name))
		if err != nil {
			t.Fatal(err)
		}
		if !c.room(m) || len(m.Shards) == 0 {
			t.Fatalf("%s: the store holds %d tokens in %d shards, past the limit", c.name, m.Tokens, len(m.Shards))
		}
		stopped := 0
		snap, err := e.c.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// A file stops at its append, or, once an append was refused and
		// the store is full, at its shard.
		for _, ts := range snap.Tasks {
			var store string
			switch ts.Kind {
			case scheduler.KindIngestAppend:
				a, _ := scheduler.DecodeTask[scheduler.IngestAppend](ts.Payload)
				store = a.Store
			case scheduler.KindIngestShard:
				a, _ := scheduler.DecodeTask[scheduler.IngestShard](ts.Payload)
				store = a.Store
			}
			if store != c.name {
				continue
			}
			if ts.State != "completed" || ts.LastErr != "" {
				t.Fatalf("%s: %s %s is %s: %q", c.name, ts.Kind, ts.ID, ts.State, ts.LastErr)
			}
			if ts.Progress.State == "stopped" {
				if !strings.Contains(ts.Progress.Message, "store "+c.name+" stopped") || !strings.Contains(ts.Progress.Message, c.flag) {
					t.Fatalf("%s: stopped %s says %q", c.name, ts.Kind, ts.Progress.Message)
				}
				stopped++
			}
		}
		if stopped == 0 || len(m.Shards)+stopped != 6 {
			t.Fatalf("%s: %d appended and %d files stopped at the limit; want the 6 files split between them", c.name, len(m.Shards), stopped)
		}
		logged := logs.FilterMessage("task done: the ingest reached its limit").FilterFieldKey("reason").All()
		n := 0
		for _, l := range logged {
			if r := l.ContextMap()["reason"].(string); l.Level == zap.InfoLevel && strings.Contains(r, "store "+c.name+" stopped") && strings.Contains(r, c.flag) {
				n++
			}
		}
		if n != stopped {
			t.Fatalf("%s: %d stops logged at info, want %d", c.name, n, stopped)
		}
		if left, _ := e.objects.List(context.Background(), ingest.ShardPrefix(c.name)); len(left) != 0 {
			t.Fatalf("%s: shards left in object storage after the stop: %v", c.name, left)
		}
	}

	// A plan for a store already at its limit enqueues nothing.
	id := e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: "one", Tokenizer: ingestTokenizer, Limits: ingest.Limits{MaxTokens: perFile}})
	ts := e.waitFor(id, time.Minute, "completed", state("completed"))
	if ts.Progress.State != "stopped" || !strings.Contains(ts.Progress.Message, "--max-tokens is") || ts.LastErr != "" || ts.Retried != 0 {
		t.Fatalf("plan at the limit: progress %+v, last error %q, retried %d", ts.Progress, ts.LastErr, ts.Retried)
	}
	if a := e.archived(scheduler.QueueAppend); len(a) != 0 {
		t.Fatalf("an append was archived: %s", a[0].LastErr)
	}
	if a := e.archived(scheduler.QueueIngest); len(a) != 0 {
		t.Fatalf("an ingest task was archived: %s", a[0].LastErr)
	}
	// A plan naming an unknown dataset is archived with the choices.
	id = e.enqueue(scheduler.IngestPlan{Dataset: "nope", Store: "x", Tokenizer: ingestTokenizer})
	ts = e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, `unknown dataset "nope"`) || ts.Retried != 0 {
		t.Fatalf("unknown dataset: %q retried %d", ts.LastErr, ts.Retried)
	}
}

// SIGKILL of the append worker in the middle of an append, then the retry
// by a new append worker: the store holds every shard exactly once. The
// append worker is a separate process with its own store directory; the
// shard worker (this process) has its own data directory.
func TestAppendWorkerKilledMidAppend(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for asynq's lease expiry (about a minute)")
	}
	e := newIngestEnv(t)
	filler := strings.Repeat(" jumps over the lazy dog and prints hello, world", 40)
	// Shards of ~1.6 MB: the appender writes 1 MiB at a time, so each
	// append has bytes on disk past the committed count for a while.
	want := e.addGoodFiles("big", 3, 1000, filler)
	e.configure(t.TempDir(), "") // this process cannot append: it has no stores
	e.serve(map[string]int{scheduler.QueueIngest: 2})
	storesDir, appendData := t.TempDir(), t.TempDir()
	child := func(delay, prefetch string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KILN_TEST_INGEST_WORKER=append=1", "KILN_TEST_REDIS_URL="+e.url,
			"KILN_TEST_S3_ENDPOINT="+e.s3.Endpoint, "KILN_TEST_S3_ACCESS="+e.s3.AccessKey, "KILN_TEST_S3_SECRET="+e.s3.SecretKey,
			"KILN_TEST_STORES="+storesDir, "KILN_TEST_DATA="+appendData, "KILN_TEST_READ_DELAY="+delay,
			"KILN_TEST_PREFETCH="+prefetch)
		logf, err := os.Create(filepath.Join(t.TempDir(), "append-worker.log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("append worker log:\n%s", b)
			}
			logf.Close()
		})
		return cmd
	}
	// The first worker streams every shard into the store, so that the kill
	// can land with part of one written; the second reads each shard
	// before it takes the store, as workers do by default.
	first := child("50ms", "-1")
	e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: ingestStore, Tokenizer: ingestTokenizer, Seed: 3})

	// Kill once some shard is committed and another is part-way in: bytes
	// of it written past the committed count.
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	dir := filepath.Join(storesDir, ingestStore)
	var victim string
	deadline := time.Now().Add(2 * time.Minute)
	for victim == "" {
		if time.Now().After(deadline) {
			t.Fatal("no append was seen part-way in")
		}
		time.Sleep(20 * time.Millisecond)
		m, err := tokens.ReadManifest(dir)
		if err != nil || len(m.Shards) == 0 {
			continue
		}
		if st, err := os.Stat(filepath.Join(dir, tokens.TokensFile)); err != nil || st.Size() <= m.Tokens*2 {
			continue
		}
		if active, _ := insp.ListActiveTasks(scheduler.QueueAppend); len(active) == 1 {
			victim = active[0].ID
		}
	}
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(filepath.Join(dir, tokens.TokensFile)); st.Size() <= m.Tokens*2 {
		t.Fatalf("tokens.bin is %d bytes and %d tokens are committed: the kill did not land mid-append", st.Size(), m.Tokens)
	}
	committedAtKill := len(m.Shards)

	// asynq hands a killed worker's task to another once its lease is 30s
	// past expiry; a worker recovers such tasks as it starts.
	exp, err := e.rdb.ZScore(context.Background(), "asynq:{"+scheduler.QueueAppend+"}:lease", victim).Result()
	if err != nil {
		t.Fatalf("lease of %s: %v", victim, err)
	}
	time.Sleep(time.Until(time.Unix(int64(exp), 0).Add(31 * time.Second)))
	child("0", "0")
	e.waitFor(victim, time.Minute, "completed by the second append worker", state("completed"))
	e.waitDrained(2 * time.Minute)

	got, m := ingestStoreDocs(t, e.tok, dir)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("after the retry the store holds %d documents, want each of %d exactly once", len(got), len(want))
	}
	if len(m.Shards) != 3 || committedAtKill >= 3 {
		t.Fatalf("%d shards in the store (%d committed at the kill)", len(m.Shards), committedAtKill)
	}
	if st, _ := os.Stat(filepath.Join(dir, tokens.TokensFile)); st.Size() != m.Tokens*2 {
		t.Fatalf("tokens.bin is %d bytes, the manifest commits %d tokens", st.Size(), m.Tokens)
	}
	if left, _ := e.objects.List(context.Background(), ingest.ShardPrefix(ingestStore)); len(left) != 0 {
		t.Fatalf("shard objects left: %v", left)
	}
}

// configureLocal sets the ingest handlers with local roots.
func (e *ingestEnv) configureLocal(dataDir, storesDir string, roots ...string) {
	e.handlers.Ingest = &Ingest{
		Pipeline: ingest.Pipeline{Objects: e.objects, Presets: e.presets, DataDir: dataDir, StoresDir: storesDir, LocalRoots: roots, Logger: zap.NewNop()},
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Again(ctx, a); return err },
	}
}

// A task written straight into Redis that names a local file outside the
// worker's roots is archived at once, naming the path and the setting,
// with nothing read or stored; a plan of a glob outside them too. Inside
// the roots the same worker ingests.
func TestIngestRefusesLocalPathsOutsideItsRoots(t *testing.T) {
	e := newIngestEnv(t)
	root, storesDir := t.TempDir(), t.TempDir()
	e.configureLocal(t.TempDir(), storesDir, root)
	e.serve(map[string]int{scheduler.QueueIngest: 1, scheduler.QueueAppend: 1})

	raw, err := scheduler.Encode(scheduler.IngestShard{Dataset: "local:/etc/*", Path: "/etc/passwd", Store: "leak",
		Tokenizer: ingestTokenizer, ShardID: "local:/etc/*//etc/passwd"})
	if err != nil {
		t.Fatal(err)
	}
	ac := asynq.NewClient(e.opt)
	defer ac.Close()
	info, err := ac.Enqueue(asynq.NewTask(scheduler.IngestShard{}.Kind(), raw), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(5))
	if err != nil {
		t.Fatal(err)
	}
	plan := e.enqueue(scheduler.IngestPlan{Dataset: "local:/etc/pass*", Store: "leak", Tokenizer: ingestTokenizer})
	for _, id := range []string{info.ID, plan} {
		ts := e.waitFor(id, time.Minute, "archived", state("archived"))
		if !strings.Contains(ts.LastErr, "/etc/passwd") || !strings.Contains(ts.LastErr, "KILN_LOCAL_ROOTS") || ts.Retried != 0 {
			t.Fatalf("task %s: archived after %d retries with %q; want no retry and an error naming /etc/passwd and KILN_LOCAL_ROOTS", id, ts.Retried, ts.LastErr)
		}
	}
	if left, err := e.objects.List(context.Background(), "tokens/leak/"); err != nil || len(left) != 0 {
		t.Fatalf("objects written for the refused tasks: %v %v", left, err)
	}
	if _, err := os.Stat(filepath.Join(storesDir, "leak")); !os.IsNotExist(err) {
		t.Fatalf("a store was made for the refused tasks: %v", err)
	}

	os.WriteFile(filepath.Join(root, "a.jsonl"), []byte(`{"text":"inside the root: the quick brown fox"}`+"\n"), 0o644)
	id := e.enqueue(scheduler.IngestPlan{Dataset: "local:" + filepath.Join(root, "*.jsonl"), Store: "inside", Tokenizer: ingestTokenizer})
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(time.Minute)
	docs, _ := ingestStoreDocs(t, e.tok, filepath.Join(storesDir, "inside"))
	if !slices.Equal(docs, []string{"inside the root: the quick brown fox"}) {
		t.Fatalf("store inside the root holds %q", docs)
	}
}

// The stores live on the appending worker's disk, their statuses in
// object storage: a store restored from a backup of fewer files, or lost
// with its disk, is planned again in full once that worker has started
// (ReconcileStores, which its start runs), as operations.md tells the
// user: the same `sched enqueue ingest` fills it again, no file twice.
func TestAStoreRestoredOrLostIsIngestedAgain(t *testing.T) {
	e := newIngestEnv(t)
	root, storesDir := t.TempDir(), t.TempDir()
	e.configureLocal(t.TempDir(), storesDir, root)
	e.handlers.Ingest.Redis = e.rdb // as sched worker's: it says in Redis which stores went
	e.serve(map[string]int{scheduler.QueueIngest: 2, scheduler.QueueAppend: 1})
	var want []string
	write := func(f int) {
		var b strings.Builder
		for d := range 3 {
			s := fmt.Sprintf("file %d doc %d: the quick brown fox", f, d)
			fmt.Fprintf(&b, `{"text":%q}`+"\n", s)
			want = append(want, s)
		}
		os.WriteFile(filepath.Join(root, fmt.Sprintf("f%d.jsonl", f)), []byte(b.String()), 0o644)
	}
	dir := filepath.Join(storesDir, "kept")
	ingestAll := func() {
		t.Helper()
		// As `sched enqueue ingest` does: a completed plan runs again.
		sub, err := e.c.Again(context.Background(), scheduler.IngestPlan{Dataset: "local:" + filepath.Join(root, "*.jsonl"), Store: "kept", Tokenizer: ingestTokenizer})
		if err != nil {
			t.Fatal(err)
		}
		e.waitFor(sub.Info.ID, time.Minute, "completed", state("completed"))
		e.waitDrained(time.Minute)
	}
	holds := func(when string) {
		t.Helper()
		docs, _ := ingestStoreDocs(t, e.tok, dir)
		slices.Sort(docs)
		w := slices.Sorted(slices.Values(want))
		if !slices.Equal(docs, w) {
			t.Fatalf("%s: the store holds %d documents %q; want the %d of every file once", when, len(docs), docs, len(w))
		}
	}
	write(0)
	write(1)
	ingestAll()
	backup := t.TempDir()
	if err := os.CopyFS(backup, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	write(2)
	ingestAll()
	holds("three files ingested")

	// A backup of two files put back.
	restore := func() {
		t.Helper()
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if err := os.CopyFS(dir, os.DirFS(backup)); err != nil {
			t.Fatal(err)
		}
	}
	restore()
	core, logs := observer.New(zap.WarnLevel)
	if rs := e.handlers.Ingest.ReconcileStores(context.Background(), zap.New(core)); len(rs) != 1 || rs[0] != (ingest.Reconciled{Store: "kept", Listed: 3, Holds: 2}) {
		t.Fatalf("reconciled %+v (logs %v); want store kept, its status listing 3 files and the store holding 2", rs, logs.All())
	}
	if logs.FilterField(zap.String("store", "kept")).Len() != 1 {
		t.Errorf("logs %v; want one warning naming store kept", logs.All())
	}
	ingestAll()
	holds("after the backup was put back and the files planned again")

	// The store lost with its disk.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if rs := e.handlers.Ingest.ReconcileStores(context.Background(), zap.NewNop()); len(rs) != 1 || rs[0] != (ingest.Reconciled{Store: "kept", Listed: 3, Gone: true}) {
		t.Fatalf("reconciled %+v; want store kept, its status listing 3 files and no store here", rs)
	}
	// sched status learns when it went, for the ingest it lists as done.
	if gone, err := DeletedStores(context.Background(), e.rdb); err != nil || gone["kept"].IsZero() {
		t.Fatalf("stores recorded gone: %v, %v; want kept", gone, err)
	}
	ingestAll()
	holds("after the store was lost and the files planned again")
	// A status that says what the store holds is left alone.
	if rs := e.handlers.Ingest.ReconcileStores(context.Background(), zap.NewNop()); len(rs) != 0 {
		t.Fatalf("reconciled %+v of a store whose status is right", rs)
	}
}

// Through the queue a local file is its content: planned again under other
// glob spellings it is not queued or appended again, and a file skipped as
// corrupt is read once its content is fixed.
func TestIngestLocalFilesByContentThroughTheQueue(t *testing.T) {
	e := newIngestEnv(t)
	root, storesDir := t.TempDir(), t.TempDir()
	e.configureLocal(t.TempDir(), storesDir, root)
	e.serve(map[string]int{scheduler.QueueIngest: 2, scheduler.QueueAppend: 1})
	var want []string
	for f := range 3 {
		var b strings.Builder
		for d := range 4 {
			s := fmt.Sprintf("file %d doc %d: the quick brown fox", f, d)
			fmt.Fprintf(&b, `{"text":%q}`+"\n", s)
			want = append(want, s)
		}
		os.WriteFile(filepath.Join(root, fmt.Sprintf("f%d.jsonl", f)), []byte(b.String()), 0o644)
	}
	var z bytes.Buffer
	zw, _ := zstd.NewWriter(&z)
	var late []string
	for i := range 300 {
		s := fmt.Sprintf("late line %d: the quick brown fox", i)
		fmt.Fprintf(zw, `{"text":%q}`+"\n", s)
		late = append(late, s)
	}
	zw.Close()
	corrupt := filepath.Join(root, "late.jsonl.zst")
	os.WriteFile(corrupt, z.Bytes()[:z.Len()/2], 0o644)

	seed := uint64(0)
	plan := func(glob, wantMsg string) {
		t.Helper()
		seed++ // a plan of its own each time, even of the same glob
		id := e.enqueue(scheduler.IngestPlan{Dataset: "local:" + glob, Store: ingestStore, Tokenizer: ingestTokenizer, Seed: seed})
		ts := e.waitFor(id, time.Minute, "completed", state("completed"))
		if !strings.Contains(ts.Progress.Message, wantMsg) {
			t.Fatalf("plan of %s: %q; want %q", glob, ts.Progress.Message, wantMsg)
		}
		e.waitDrained(time.Minute)
	}
	plan(filepath.Join(root, "*"), "4 queued, 0 already queued, 0 already appended or skipped in the store")
	m1, err := tokens.ReadManifest(filepath.Join(storesDir, ingestStore))
	if err != nil || len(m1.Shards) != 3 || len(m1.Skipped) != 1 {
		t.Fatalf("first ingest: %+v, %v; want 3 shards and the cut file skipped", m1, err)
	}
	plan(root+"/./*.jsonl", "3 files planned into store corpus: 0 queued, 0 already queued, 3 already appended or skipped in the store")
	plan(root+"//*", "4 files planned into store corpus: 0 queued, 0 already queued, 4 already appended or skipped in the store")
	if m2, _ := tokens.ReadManifest(filepath.Join(storesDir, ingestStore)); m2.Tokens != m1.Tokens || len(m2.Shards) != 3 {
		t.Fatalf("another spelling changed the store: %d tokens in %d shards, was %d", m2.Tokens, len(m2.Shards), m1.Tokens)
	}

	os.WriteFile(corrupt, z.Bytes(), 0o644)
	plan(filepath.Join(root, "*"), "1 queued, 0 already queued, 3 already appended or skipped in the store")
	got, m3 := ingestStoreDocs(t, e.tok, filepath.Join(storesDir, ingestStore))
	want = append(want, late...)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(m3.Shards) != 4 {
		t.Fatalf("after the fix the store holds %d documents in %d shards; want each of %d once in 4", len(got), len(m3.Shards), len(want))
	}

	// Two new files with the same bytes: one shard, and the plan says why
	// the second is not queued.
	for _, name := range []string{"d1.jsonl", "d2.jsonl"} {
		os.WriteFile(filepath.Join(root, name), []byte(`{"text":"the same document twice"}`+"\n"), 0o644)
	}
	plan(filepath.Join(root, "*"), "6 files planned into store corpus: 1 queued, 0 already queued, 4 already appended or skipped in the store, 1 with the same content as another of its files")
	if m4, _ := tokens.ReadManifest(filepath.Join(storesDir, ingestStore)); len(m4.Shards) != 5 {
		t.Fatalf("two files of the same bytes made %d shards, want 1 (5 in all)", len(m4.Shards)-4)
	}
	for _, q := range []string{scheduler.QueueIngest, scheduler.QueueAppend} {
		if a := e.archived(q); len(a) != 0 {
			t.Fatalf("archived %s task: %s", q, a[0].LastErr)
		}
	}
}

// A worker's start aborts the multipart uploads left idle under kiln's
// prefixes for longer than it is given, logging each, and keeps the others.
func TestWorkerStartAbortsStaleUploads(t *testing.T) {
	srv := testsvc.S3(t)
	s3, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s3.Put(ctx, "results/x", strings.NewReader("x"), 1); err != nil { // makes the bucket
		t.Fatal(err)
	}
	mc, err := minio.New(srv.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	// A process that started an upload and was killed.
	if _, err := (minio.Core{Client: mc}).NewMultipartUpload(ctx, "kiln", "tokens/code/shards/orphan.tokens", minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	// Seconds old, it may be another worker's live upload: a start keeps it.
	if aborted := AbortStaleUploads(ctx, s3, store.StaleUploadAge, zap.NewNop()); len(aborted) != 0 {
		t.Fatalf("a fresh upload was aborted at start: %+v", aborted)
	}
	core, logs := observer.New(zap.InfoLevel)
	aborted := AbortStaleUploads(ctx, s3, 0, zap.New(core))
	if len(aborted) != 1 || aborted[0].Key != "tokens/code/shards/orphan.tokens" || logs.FilterMessage("removed an unfinished upload").Len() != 1 {
		t.Fatalf("aborted %+v, logs %v; want the orphan, logged", aborted, logs.All())
	}
	if ups, err := s3.Uploads(ctx, "tokens/"); err != nil || len(ups) != 0 {
		t.Fatalf("uploads left: %+v %v", ups, err)
	}
}

// A running worker keeps sweeping: an upload orphaned after its start
// (an abort that failed during an outage) goes at a later sweep, not at
// the worker's next start, weeks later.
func TestWorkerSweepsStaleUploadsWhileItRuns(t *testing.T) {
	srv := testsvc.S3(t)
	s3, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := s3.Put(ctx, "results/x", strings.NewReader("x"), 1); err != nil { // makes the bucket
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	done := make(chan struct{})
	go func() {
		defer close(done)
		SweepStaleUploads(ctx, s3, 0, 10*time.Millisecond, zap.New(core))
	}()
	mc, err := minio.New(srv.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(srv.AccessKey, srv.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (minio.Core{Client: mc}).NewMultipartUpload(ctx, "kiln", "checkpoints/r/step-0000010/model.safetensors", minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute) // for a sweep that never comes
	for logs.FilterMessage("removed an unfinished upload").Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the orphan was not aborted by a sweep; logs %v", logs.All())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ups, err := s3.Uploads(ctx, "checkpoints/"); err != nil || len(ups) != 0 {
		t.Fatalf("uploads left: %+v %v", ups, err)
	}
	cancel()
	<-done // and the sweeps end with the worker
}

// planWaitingForItsTokenizer queues the training of tokenizer tok, on the
// append queue, which nobody serves until the test says it is done, and
// a plan of the corpus into store that tokenizes with it; it returns the
// two tasks' ids once the plan waits for the tokenizer.
func planWaitingForItsTokenizer(t *testing.T, e *ingestEnv, tok, store string) (train, plan string) {
	t.Helper()
	e.addGoodFiles("good", 2, 3, "")
	e.handlers.Ingest = &Ingest{
		Pipeline: ingest.Pipeline{Objects: e.objects, Hub: e.hc, Presets: e.presets, DataDir: t.TempDir(), StoresDir: t.TempDir(), Logger: zap.NewNop()},
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Again(ctx, a); return err },
		Queue:    e.c, WaitEvery: 50 * time.Millisecond,
	}
	train = e.enqueue(scheduler.TokenizerTrain{Name: tok, VocabSize: 320})
	e.serve(map[string]int{scheduler.QueueIngest: 1})
	plan = e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: store, Tokenizer: tok})
	e.waitFor(plan, time.Minute, "waiting for its tokenizer", func(ts scheduler.TaskStatus) bool {
		return strings.Contains(ts.LastErr, "waiting for tokenizer "+tok)
	})
	return train, plan
}

// A plan queued while its tokenizer is still being trained waits for it,
// using no retry, and plans once the tokenizer is made: `sched enqueue
// tokenizer` and `sched enqueue ingest` can be typed one after the other.
func TestIngestPlanWaitsForItsTokenizer(t *testing.T) {
	e := newIngestEnv(t)
	train, plan := planWaitingForItsTokenizer(t, e, "later-bpe", "later")

	// The training finishes: the tokenizer is published, its task gone.
	tj, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("the quick brown fox\n", 100))}, tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.New(e.objects, t.TempDir()).Publish(context.Background(), "later-bpe", tj); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Cancel(context.Background(), train); err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(plan, time.Minute, "completed", state("completed"))
	if ts.Retried != 0 {
		t.Errorf("the plan used %d retries waiting; want none", ts.Retried)
	}
	// Its two files are queued: each a shard, or the append the shard has
	// queued, which no worker serves here (a shard handing over counts both).
	if n, err := e.c.LiveIngest(context.Background(), "later"); err != nil || n < 2 {
		t.Errorf("after the plan, %d live tasks fill store later (%v); want its 2 files' tasks", n, err)
	}
}

// A plan that waited for its tokenizer, whose making is then cancelled,
// fails once, naming the tokenizer and what to do, and queues none of its
// files, where each of them failed for good on a tokenizer not known.
func TestIngestPlanWhoseTokenizerWasCancelledFailsOnce(t *testing.T) {
	e := newIngestEnv(t)
	train, plan := planWaitingForItsTokenizer(t, e, "never-bpe", "never")
	if _, err := e.c.Cancel(context.Background(), train); err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(plan, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, "its tokenizer never-bpe is neither made nor being made") || !strings.Contains(ts.LastErr, "make the tokenizer, then queue this ingest again") {
		t.Errorf("the plan failed with %q; want its tokenizer named and what to do", ts.LastErr)
	}
	if n, err := e.c.LiveIngest(context.Background(), "never"); err != nil || n != 0 {
		t.Errorf("after the plan, %d live tasks fill store never (%v); want none queued", n, err)
	}
}

// A shard's last message lists the documents left out only when there were
// some: a clean file's does not end in an empty list.
func TestShardDoneMessage(t *testing.T) {
	clean := shardDone("data/a.parquet", ingest.AppendJob{Documents: 5, Tokens: 105})
	if clean != "data/a.parquet: 5 documents, 105 tokens" {
		t.Errorf("clean shard: %q", clean)
	}
	some := shardDone("data/b.parquet", ingest.AppendJob{Documents: 5, Tokens: 105, Skipped: ingest.Skips{"invalid-utf8": 1, "empty": 2}})
	if some != "data/b.parquet: 5 documents, 105 tokens, skipped documents: empty=2, invalid-utf8=1" {
		t.Errorf("shard with skipped documents: %q", some)
	}
}
