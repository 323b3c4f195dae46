package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/klauspost/compress/zstd"
	"github.com/parquet-go/parquet-go"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/ingest/sample"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokenizer/tokenizertest"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

type contentRow struct {
	Content string `parquet:"content"`
}

type textRow struct {
	Text string `parquet:"text"`
}

func parquetOf[T any](t *testing.T, rows []T) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := parquet.NewGenericWriter[T](&buf, parquet.MaxRowsPerRowGroup(16))
	if _, err := w.Write(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// mixedHub serves three datasets the way their real counterparts are laid
// out: code in parquet "content", prose in parquet "text", maths in zstd
// JSON lines under <config>/train/.
func mixedHub(t *testing.T) (*hubtest.Hub, map[string]ingest.Preset) {
	h := hubtest.New()
	t.Cleanup(h.Close)
	code := tokenizertest.Documents(tokenizertest.Text(t, "go")+tokenizertest.Text(t, "python"), 1500)
	for f := range 8 {
		var rows []contentRow
		for i := f; i < len(code); i += 8 {
			rows = append(rows, contentRow{code[i]})
		}
		h.Add("bigcode/code", fmt.Sprintf("data/Go/train-%05d.parquet", f), parquetOf(t, rows), true)
	}
	prose := tokenizertest.Documents(tokenizertest.Text(t, "english"), 600)
	for f := range 4 {
		var rows []textRow
		for i := f; i < len(prose); i += 4 {
			rows = append(rows, textRow{prose[i]})
		}
		h.Add("web/prose", fmt.Sprintf("sample/100BT/%03d_00000.parquet", f), parquetOf(t, rows), true)
	}
	for f := range 4 {
		var z bytes.Buffer
		zw, _ := zstd.NewWriter(&z)
		for i := range 150 {
			n := f*1000 + i
			doc := fmt.Sprintf("\\begin{theorem} For $n \\ge %d$, $\\sum_{k=1}^{n} k^{%d} \\le \\frac{n^{%d}}{%d} + O(n^{%d})$. \\end{theorem}\n\\begin{proof} By induction on $n$; the case $n = %d$ holds since $\\int_0^1 x^{%d}\\,dx = \\frac{1}{%d}$. \\end{proof}\n",
				n%7, n%5+1, n%5+2, n%5+2, n%5+1, n%7, n%4, n%4+1)
			b, _ := json.Marshal(map[string]string{"text": doc})
			zw.Write(append(b, '\n'))
		}
		zw.Close()
		h.Add("math/pile", fmt.Sprintf("arxiv/train/arxiv_%04d.jsonl.zst", f), z.Bytes(), true)
	}
	presets := map[string]ingest.Preset{
		"code":   {Name: "code", Repo: "bigcode/code", Revision: "main", Include: []string{"data/{language}/*.parquet"}, Vars: map[string][]string{"language": {"*"}}, Columns: ingest.Columns{Text: "content"}},
		"prose":  {Name: "prose", Repo: "web/prose", Revision: "main", Include: []string{"sample/100BT/*.parquet"}, Columns: ingest.Columns{Text: "text"}},
		"maths":  {Name: "maths", Repo: "math/pile", Revision: "main", Include: []string{"{config}/train/*.jsonl.zst"}, Vars: map[string][]string{"config": {"arxiv"}}, Columns: ingest.Columns{Text: "text"}},
		"absent": {Name: "absent", Repo: "nobody/nothing", Revision: "main", Include: []string{"*.parquet"}},
	}
	return h, presets
}

// hubSampler is a sampling handler against mixedHub that knows the hub's
// presets named in only (all of them when none), and the tasks it queues.
func hubSampler(t *testing.T, only ...string) (tk *Tokenizers, presets map[string]ingest.Preset, queued *[]scheduler.Args) {
	t.Helper()
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h, presets := mixedHub(t)
	known := presets
	if len(only) > 0 {
		known = map[string]ingest.Preset{}
		for _, name := range only {
			known[name] = presets[name]
		}
	}
	hc, _ := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 1})
	queued = new([]scheduler.Args)
	tk, err = (&Tokenizers{Objects: objects, DataDir: t.TempDir(), Hub: hc, Presets: known,
		Enqueue: func(_ context.Context, a scheduler.Args) error { *queued = append(*queued, a); return nil }}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	return tk, presets, queued
}

func newTestS3(t *testing.T) store.Store {
	t.Helper()
	srv := testsvc.S3(t)
	s, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The whole path of a new tokenizer through a real Redis and a real S3
// server against the fake hub: one sampling task per dataset on the ingest
// queue, the last of them queuing the training on the append queue, which
// publishes tokenizer.json in object storage and the data directory with a
// report beside the previous tokenizer's figures.
func TestTokenizerSampledAndTrainedThroughTheQueues(t *testing.T) {
	e := newEnv(t)
	objects := newTestS3(t)
	h, presets := mixedHub(t)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dataDir := t.TempDir()
	cat := catalog.New(objects, dataDir)
	prevData, err := tokenizer.Train(ctx, []io.Reader{strings.NewReader(tokenizertest.Text(t, "english"))}, tokenizer.TrainOptions{VocabSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cat.Publish(ctx, "kiln-bpe", prevData); err != nil {
		t.Fatal(err)
	}
	tk, err := (&Tokenizers{
		Objects: objects, DataDir: dataDir, Hub: hc, Presets: presets, Log: zap.NewNop(),
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
	}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueIngest: 2, scheduler.QueueAppend: 1}, Handlers: Handlers{Tokenizers: tk}, Logger: zap.NewNop(),
		DelayedTaskCheckInterval: 200 * time.Millisecond, ProgressEvery: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	mix, err := sample.ParseMix("code=0.7,prose=0.2,maths=0.1")
	if err != nil {
		t.Fatal(err)
	}
	const total = 120_000
	tasks := TokenizerSampleTasks("mixed", mix, total, 1024, 42, "kiln-bpe")
	var ids []string
	for _, task := range tasks {
		ids = append(ids, e.enqueue(task))
	}
	for _, id := range ids {
		e.waitFor(id, time.Minute, "completed", state("completed"))
	}
	trainID, err := scheduler.TaskID(TokenizerTrainTask(tasks[0]))
	if err != nil {
		t.Fatal(err)
	}
	e.waitFor(trainID, 2*time.Minute, "completed", state("completed"))

	// Each dataset's sample holds its weight's part of the bytes.
	prefix := TokenizerTrainTask(tasks[0]).Sample
	for i, s := range mix {
		r, err := objects.Get(ctx, sample.SampleKey(prefix, s.Dataset))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		got := len(strings.ReplaceAll(string(b), sample.Separator, ""))
		if int64(got) != tasks[i].Bytes || tasks[i].Bytes != int64(total*s.Weight+0.5) {
			t.Errorf("%s: sample of %d bytes, budget %d (weight %.1f of %d)", s.Dataset, got, tasks[i].Bytes, s.Weight, total)
		}
	}

	// The tokenizer is in object storage and in the data directory, and a
	// second machine resolves the same bytes.
	entry, tok, err := catalog.New(objects, t.TempDir()).Resolve(ctx, "mixed")
	if err != nil {
		t.Fatal(err)
	}
	local, err := os.ReadFile(filepath.Join(dataDir, "tokenizers", "mixed", "tokenizer.json"))
	if err != nil || tokenizerSHA(t, local) != entry.SHA256 {
		t.Fatalf("the data directory's copy: %v", err)
	}
	if tok.VocabSize() != 1024 || fmt.Sprint(entry.Special) != "[<|endoftext|>]" {
		t.Fatalf("vocab %d, special tokens %v", tok.VocabSize(), entry.Special)
	}
	rep, ok, err := cat.GetReport(ctx, "mixed")
	if err != nil || !ok {
		t.Fatalf("report: %v %v", ok, err)
	}
	if rep.SHA256 != entry.SHA256 || rep.VocabSize != 1024 || rep.Previous == nil || rep.Previous.Name != "kiln-bpe" || len(rep.Sources) != 3 {
		t.Fatalf("report %+v", rep)
	}
	for _, s := range rep.Sources {
		if s.Documents == 0 || s.BytesPerToken <= 1 || s.Previous == nil || s.Previous.BytesPerToken <= 0 {
			t.Errorf("source %s: %+v", s.Source, s)
		}
		if s.Source == "code" && s.BytesPerToken <= s.Previous.BytesPerToken {
			t.Errorf("code: the mixed tokenizer (%.3f bytes/token) does not beat the prose one (%.3f)", s.BytesPerToken, s.Previous.BytesPerToken)
		}
	}
	if _, err := objects.Stat(ctx, catalog.ReportMarkdownKey("mixed")); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", rep.Markdown())

	// Enqueued again, the same tokenizer is a duplicate; a retried training
	// finds its own report and does nothing.
	if _, err := e.c.Enqueue(ctx, tasks[0]); err == nil {
		t.Fatal("the same sampling task was queued twice")
	}
	if err := tk.train(ctx, TokenizerTrainTask(tasks[0])); err != nil {
		t.Fatalf("retried training: %v", err)
	}

	// Another mixture under the same name is refused before training, with
	// a message naming the existing tokenizer, and archived at once.
	other := TokenizerSampleTasks("mixed", mix[:1], 10_000, 1024, 42, "")
	otherID := e.enqueue(other[0])
	e.waitFor(otherID, time.Minute, "completed", state("completed"))
	otherTrain, _ := scheduler.TaskID(TokenizerTrainTask(other[0]))
	ts := e.waitFor(otherTrain, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, `tokenizer "mixed" already exists`) || !strings.Contains(ts.LastErr, entry.SHA256) {
		t.Fatalf("archived with %q", ts.LastErr)
	}
	if again, _, _ := cat.Resolve(ctx, "mixed"); again.SHA256 != entry.SHA256 {
		t.Fatal("the published tokenizer changed")
	}

	// A sample too small for the ids asked gives a tokenizer of fewer: the
	// task's last message, which `sched runs` shows, says so.
	short := TokenizerSampleTasks("short", mix[:1], 3_000, 4096, 42, "")
	e.waitFor(e.enqueue(short[0]), time.Minute, "completed", state("completed"))
	shortTrain, _ := scheduler.TaskID(TokenizerTrainTask(short[0]))
	ts = e.waitFor(shortTrain, 2*time.Minute, "completed", state("completed"))
	if !ts.HasProgress || !strings.Contains(ts.Progress.Message, "ids of the 4096 asked") {
		t.Errorf("a tokenizer of fewer ids than asked ended saying %q", ts.Progress.Message)
	}
}

func tokenizerSHA(t *testing.T, b []byte) string {
	tk, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tk.SHA256()
}

// A sampling task that cannot succeed (an unknown dataset, a bad name, a
// dataset missing from the hub) is archived with its reason, not retried.
// A sample whose Hub answers 503 says so in its task's message while it
// waits, after what it does, where sched status showed "sampling" with no
// word of the wait; once the Hub is back it is drawn.
func TestATokenizerSampleSaysItWaitsForTheHub(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	h, presets := mixedHub(t)
	h.SetUnavailable(1<<30, 1)
	hc, err := hub.New(hub.Config{Endpoint: h.Server.URL, MaxRetries: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	tk, err := (&Tokenizers{Objects: objects, DataDir: t.TempDir(), Hub: hc, Presets: presets, Log: zap.NewNop(),
		Enqueue: func(ctx context.Context, a scheduler.Args) error { return nil }}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	e.handlers = Handlers{Tokenizers: tk}
	e.startInProcess()
	id := e.enqueue(TokenizerSampleTasks("tok", []sample.Share{{Dataset: "prose", Weight: 1}}, 20_000, 512, 1, "")[0])
	e.waitFor(id, time.Minute, "saying it waits for the Hub", func(ts scheduler.TaskStatus) bool {
		return ts.State == "active" && regexp.MustCompile(`^sampling 20000 bytes of prose for tokenizer tok: .* answered 503 Service Unavailable; trying again in 1s \(attempt \d+ of \d+\)$`).MatchString(ts.Progress.Message)
	})
	h.SetUnavailable(0, 0)
	e.waitFor(id, time.Minute, "completed", state("completed"))
}

func TestTokenizerSampleRefusals(t *testing.T) {
	tk, _, queued := hubSampler(t)
	mix := []sample.Share{{Dataset: "code", Weight: 1}}
	ok := TokenizerSampleTasks("tok", mix, 1000, 512, 1, "")[0]
	for name, c := range map[string]struct {
		edit func(*scheduler.TokenizerSample)
		want string
	}{
		"unknown dataset": {func(a *scheduler.TokenizerSample) { a.Dataset = "no-such-set" }, `unknown dataset "no-such-set"`},
		"bad name":        {func(a *scheduler.TokenizerSample) { a.Name = "a/b" }, `tokenizer name "a/b"`},
		"no size":         {func(a *scheduler.TokenizerSample) { a.Bytes = 0 }, "no dataset, size or mixture"},
		"not on the hub":  {func(a *scheduler.TokenizerSample) { a.Dataset = "absent" }, "nobody/nothing"},
	} {
		a := ok
		c.edit(&a)
		err := tk.sample(context.Background(), a)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want %q", name, err, c.want)
		}
		if name != "not on the hub" && !errors.Is(err, asynq.SkipRetry) {
			t.Errorf("%s: %v is retried", name, err)
		}
	}
	if len(*queued) != 0 {
		t.Fatalf("a failed sample queued %v", *queued)
	}
	if err := tk.sample(context.Background(), ok); err != nil {
		t.Fatal(err)
	}
	if len(*queued) != 1 || (*queued)[0].(scheduler.TokenizerTrain).Sample != TokenizerTrainTask(ok).Sample {
		t.Fatalf("the only sample drawn did not queue the training: %v", *queued)
	}
}

// A tokenizer:sample written straight into Redis that names a local glob
// outside the worker's roots (/etc/*) is archived at once, naming the path
// and the setting, before anything is read: no download directory is made
// and no sample stored. Inside the roots the same worker samples.
func TestTokenizerSampleRefusesLocalFilesOutsideItsRoots(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root, dataDir := t.TempDir(), t.TempDir()
	for i, doc := range tokenizertest.Documents(tokenizertest.Text(t, "go"), 2000)[:4] {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("%d.txt", i)), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.handlers.Tokenizers = &Tokenizers{Objects: objects, DataDir: dataDir, LocalRoots: []string{root}, Log: zap.NewNop(),
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueIngest: 1})

	raw := asynq.NewClient(e.opt)
	defer raw.Close()
	payload := `{"v":1,"args":{"name":"etc-bpe","dataset":"local:/etc/*","bytes":4096,"mixture":[{"dataset":"local:/etc/*","weight":1}],"total_bytes":4096}}`
	info, err := raw.Enqueue(asynq.NewTask(scheduler.KindTokenizerSample, []byte(payload), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(5)))
	if err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(info.ID, time.Minute, "archived", state("archived"))
	if ts.Retried != 0 || !strings.Contains(ts.LastErr, "/etc/") || !strings.Contains(ts.LastErr, "KILN_LOCAL_ROOTS") {
		t.Errorf("archived after %d retries with %q; want at once, naming the file under /etc and KILN_LOCAL_ROOTS", ts.Retried, ts.LastErr)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused sample made its download directory (%v): it began reading", err)
	}
	if objs, err := objects.List(context.Background(), "tokenizers/"); err != nil || len(objs) != 0 {
		t.Errorf("objects after the refusal: %v (%v); want none", objs, err)
	}

	id := e.enqueue(scheduler.TokenizerSample{Name: "root-bpe", Dataset: ingest.LocalPrefix + filepath.Join(root, "*.txt"), Bytes: 2048,
		Mixture: []scheduler.TokenizerShare{{Dataset: ingest.LocalPrefix + filepath.Join(root, "*.txt"), Weight: 1}}, TotalBytes: 2048})
	e.waitFor(id, time.Minute, "completed", state("completed"))
}

// A sampling task carries its dataset's preset as 'sched enqueue tokenizer'
// resolved it (a presets file's entry, say): a worker whose own presets do
// not name the dataset samples it all the same, and one carrying another
// dataset's preset is refused for good, nothing drawn.
func TestTokenizerSampleTakesTheCarriedPreset(t *testing.T) {
	// The worker knows only the prose.
	tk, presets, queued := hubSampler(t, "prose")
	a := TokenizerSampleTasks("tok", []sample.Share{{Dataset: "code", Weight: 1}}, 1000, 512, 1, "")[0]
	if err := tk.sample(context.Background(), a); err == nil || !strings.Contains(err.Error(), `unknown dataset "code"`) {
		t.Fatalf("no preset carried: %v; want the worker's unknown dataset", err)
	}
	wrong := a
	wrong.Preset = ingest.Carried(presets["prose"])
	if err := tk.sample(context.Background(), wrong); err == nil || !errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), `carries the preset of "prose"`) {
		t.Fatalf("another dataset's preset carried: %v; want a refusal for good", err)
	}
	if len(*queued) != 0 {
		t.Fatalf("a refused sample queued %v", *queued)
	}
	a.Preset = ingest.Carried(presets["code"])
	if err := tk.sample(context.Background(), a); err != nil {
		t.Fatalf("the code's preset carried: %v", err)
	}
	if len(*queued) != 1 {
		t.Fatalf("the only sample drawn did not queue the training: %v", *queued)
	}
}

// tokenizerTaskEnv makes TestHelperTokenizerTask run a tokenizer task: the
// variable holds the kind (train or sample), the data directory and the
// object directory, one a line.
const tokenizerTaskEnv = "KILN_TEST_TOKENIZER_TASK"

// waitingGets is a store whose Get waits with wait, then fails.
type waitingGets struct {
	store.Store
	wait func()
}

func (s waitingGets) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.wait()
	return nil, fmt.Errorf("get %s: the test released the task", key)
}

// TestHelperTokenizerTask is a tokenizer task of
// TestTokenizerTempDirsOfKilledTasksAreRemoved, made by a worker started
// on the data directory: once it holds its temporary directory, where a
// training fetches its sample or a sampling asks the hub for its files, it
// prints "waiting" and waits for its stdin to close, then fails.
func TestHelperTokenizerTask(t *testing.T) {
	args := strings.Split(os.Getenv(tokenizerTaskEnv), "\n")
	if len(args) != 3 {
		t.Skip("a helper process of TestTokenizerTempDirsOfKilledTasksAreRemoved")
	}
	released := make(chan struct{})
	go func() {
		io.Copy(io.Discard, os.Stdin)
		close(released)
	}()
	var once sync.Once
	wait := func() {
		once.Do(func() { os.Stdout.WriteString("waiting\n") })
		<-released
	}
	hubSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wait()
		http.Error(w, "the test released the task", http.StatusNotFound)
	}))
	defer hubSrv.Close()
	hc, err := hub.New(hub.Config{Endpoint: hubSrv.URL, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	objects, err := store.NewLocal(args[2])
	if err != nil {
		t.Fatal(err)
	}
	prose := ingest.Preset{Name: "prose", Repo: "web/prose", Revision: "main", Include: []string{"*.parquet"}, Columns: ingest.Columns{Text: "text"}}
	tk, err := (&Tokenizers{Objects: waitingGets{objects, wait}, DataDir: args[1], Hub: hc, Presets: map[string]ingest.Preset{"prose": prose},
		Enqueue: func(context.Context, scheduler.Args) error { return nil }}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	mix := []scheduler.TokenizerShare{{Dataset: "prose", Weight: 1}}
	switch args[0] {
	case "train":
		err = tk.train(context.Background(), scheduler.TokenizerTrain{Name: "tok", VocabSize: 300, Sample: "samples/tok", Mixture: mix})
	case "sample":
		err = tk.sample(context.Background(), scheduler.TokenizerSample{Name: "tok", Dataset: "prose", Bytes: 1000, Mixture: mix, TotalBytes: 1000})
	default:
		t.Fatalf("task kind %q", args[0])
	}
	t.Logf("released: %v", err)
}

// Tokenizer tasks killed by SIGKILL leave their temporary directories (a
// training's holds its whole sample); a worker started on the data
// directory removes them, and so does the next task of their kind, while
// the directories of tasks still running beside them, in other workers
// sharing the directory, are kept.
func TestTokenizerTempDirsOfKilledTasksAreRemoved(t *testing.T) {
	dataDir, objDir := t.TempDir(), t.TempDir()
	task := func(kind string) string { return tokenizerTaskEnv + "=" + kind + "\n" + dataDir + "\n" + objDir }
	dirs := func(pattern string) []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(dataDir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	const train, samples = "tokenizer-train-*", "tmp/sample-*"

	testsvc.StartChild(t, "TestHelperTokenizerTask", task("train"))
	liveSample := testsvc.StartChild(t, "TestHelperTokenizerTask", task("sample"))
	liveTrain, liveSamples := dirs(train), dirs(samples)
	if len(liveTrain) != 1 || len(liveSamples) != 1 {
		t.Fatalf("running tasks hold %v and %v; want a training's directory and a sampling's", liveTrain, liveSamples)
	}
	// Both are running before either is killed: a worker's start would
	// remove the other's directory once it was killed.
	killedTrain := testsvc.StartChild(t, "TestHelperTokenizerTask", task("train"))
	killedSample := testsvc.StartChild(t, "TestHelperTokenizerTask", task("sample"))
	killedTrain.Kill(t)
	killedSample.Kill(t)
	if len(dirs(train)) != 2 || len(dirs(samples)) != 2 {
		t.Fatalf("after the kills: %v and %v; want the killed tasks' directories beside the live ones'", dirs(train), dirs(samples))
	}

	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for i, doc := range tokenizertest.Documents(tokenizertest.Text(t, "go"), 2000)[:4] {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("%d.txt", i)), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tk, err := (&Tokenizers{Objects: objects, DataDir: dataDir, LocalRoots: []string{root}, Presets: map[string]ingest.Preset{},
		Enqueue: func(context.Context, scheduler.Args) error { return nil }}).resolve()
	if err != nil {
		t.Fatal(err)
	}
	if got, got2 := dirs(train), dirs(samples); !slices.Equal(got, liveTrain) || !slices.Equal(got2, liveSamples) {
		t.Fatalf("after a worker start: %v and %v; want only the live tasks' %v and %v", got, got2, liveTrain, liveSamples)
	}

	liveSample.Kill(t)
	local := ingest.LocalPrefix + filepath.Join(root, "*.txt")
	if err := tk.sample(context.Background(), scheduler.TokenizerSample{Name: "root-bpe", Dataset: local, Bytes: 2048,
		Mixture: []scheduler.TokenizerShare{{Dataset: local, Weight: 1}}, TotalBytes: 2048}); err != nil {
		t.Fatal(err)
	}
	if got, got2 := dirs(train), dirs(samples); !slices.Equal(got, liveTrain) || len(got2) != 0 {
		t.Fatalf("after the next sampling: %v and %v; want only the live training's %v", got, got2, liveTrain)
	}
}
