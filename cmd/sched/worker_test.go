package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/worker"
)

// startWorker runs `sched worker` as a child process until the test ends.
// workerLog is what the worker startWorker started has logged so far.
func workerLog(t *testing.T, w *exec.Cmd) string {
	t.Helper()
	b, err := os.ReadFile(w.Stdout.(*os.File).Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func startWorker(t *testing.T, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"worker"}, args...)...)
	cmd.Env = append(baseEnv(t), env...)
	logf, err := os.Create(t.TempDir() + "/worker.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("worker log:\n%s", b)
		}
		logf.Close()
	})
	return cmd
}

// waitStatus polls `sched status <id>` until its output matches re.
func waitStatus(t *testing.T, env []string, id string, re *regexp.Regexp, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	var out string
	for time.Now().Before(deadline) {
		out, _, _ = sched(t, env, "status", id)
		if re.MatchString(out) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("status of %s never matched %v; last: %q", id, re, out)
	return ""
}

// TestEnqueueWorkerStatusDuplicate queues a real benchmark, small enough
// for the CPU engine: enqueued twice before any worker runs, the second is
// reported as a duplicate; a worker process completes it and status and
// runs show it; enqueued once more after it completed, it runs again (a
// person asking for finished work gets it redone) and its row is written
// once per run.
func TestEnqueueWorkerStatusDuplicate(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	data := t.TempDir()
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + data}

	bench := []string{"enqueue", "bench", "tiny", "--engine", "cpu", "--batch", "1", "--seq", "16", "--steps", "2", "--warmup", "0"}
	out, errOut, code := sched(t, env, bench...)
	m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue: exit %d, %q %q", code, out, errOut)
	}
	id := m[1]
	out, _, code = sched(t, env, bench...)
	if code != 0 || !strings.Contains(out, "bench:run is already queued as "+id+"; nothing queued") {
		t.Fatalf("second enqueue: exit %d, %q; want a duplicate report naming %s", code, out, id)
	}
	startWorker(t, env, "--queues", "gpu=1")
	waitStatus(t, env, id, regexp.MustCompile(`^`+id+`\s+completed\s+100\.0%`), time.Minute)
	// The CPU computes in fp32 whatever was asked, and the task says so.
	if out, _, _ = sched(t, env, "status", id); !strings.Contains(out, `"measured tiny 1x16 fp32: `) {
		t.Errorf("sched status %s:\n%s\nwant the measure in the fp32 the CPU computed in", id, out)
	}
	out, _, _ = sched(t, env, "status")
	if !regexp.MustCompile(`(?m)^gpu\s+0\s+0\s+0\s+0\s+0\s+1$`).MatchString(out) {
		t.Fatalf("status does not show the gpu queue with one completed task:\n%s", out)
	}
	out, _, _ = sched(t, env, "runs")
	if !strings.Contains(out, id+"  completed") {
		t.Fatalf("runs does not list %s:\n%s", id, out)
	}

	out, _, code = sched(t, env, bench...)
	if code != 0 || !strings.Contains(out, "queued "+id+" on gpu again (it had completed)") {
		t.Fatalf("enqueue after completion: exit %d, %q; want it queued again", code, out)
	}
	waitStatus(t, env, id, regexp.MustCompile(`^`+id+`\s+completed\s+100\.0%`), time.Minute)
	// sched retry does the same for one task by its id.
	out, _, code = sched(t, env, "retry", id)
	if code != 0 || !strings.Contains(out, "queued "+id+" on gpu again (it had completed)") {
		t.Fatalf("sched retry %s: exit %d, %q; want it queued again", id, code, out)
	}
	waitStatus(t, env, id, regexp.MustCompile(`^`+id+`\s+completed\s+100\.0%`), time.Minute)
	if _, errOut, code := sched(t, env, "retry", "bench:run:0000"); code != 2 || !strings.Contains(errOut, "not found") {
		t.Errorf("sched retry of an unknown id: exit %d, %q; want exit 2 saying it is not found", code, errOut)
	}
	f, err := os.Open(filepath.Join(data, "objects", filepath.FromSlash(worker.BenchKey)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []results.BenchRow
	dec := json.NewDecoder(f)
	for dec.More() {
		var row results.BenchRow
		if err := dec.Decode(&row); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, row)
	}
	if len(rows) != 3 {
		t.Fatalf("bench rows %+v; want three (the task ran three times)", rows)
	}
	for _, row := range rows {
		if row.Model != "tiny" || row.Batch != 1 || row.Seq != 16 || row.TokPerSec <= 0 || row.Error != "" {
			t.Fatalf("bench row %+v; want a measured row of tiny at 1 x 16", row)
		}
	}
}

// `sched enqueue bench RUN` measures the run's own step, which its tok/s
// gate compares it with: pilot-cpu's model, engine, precision, batch,
// sequence and accumulate, with what a flag overrides. The worker
// reserves two GPUs (KILN_GPUS=2), which are not the CPU engine's: the
// run's step is measured on the CPU, where it failed as "gpus 2 needs the
// cuda engine".
func TestEnqueueBenchOfARunMeasuresItsStep(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	data := t.TempDir()
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + data}
	out, errOut, code := sched(t, env, "enqueue", "bench", "pilot-cpu", "--seq", "16", "--steps", "2", "--warmup", "0")
	m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue: exit %d, %q %q", code, out, errOut)
	}
	startWorker(t, append(env, "KILN_GPUS=2"), "--queues", "gpu=1")
	waitStatus(t, env, m[1], regexp.MustCompile(`^`+m[1]+`\s+completed\s+100\.0%`), time.Minute)
	// The finished task says what it measured, not the shape it began.
	out, _, _ = sched(t, env, "status", m[1])
	if !regexp.MustCompile(`completed  100\.0%  "measured tiny 2x16 accumulate 4 fp32: [1-9][0-9,]* tok/s on the CPU; sched results bench shows the table"`).MatchString(out) {
		t.Errorf("sched status of the finished bench:\n%s\nwant its measure and where the table is", out)
	}
	b, err := os.ReadFile(filepath.Join(data, "objects", filepath.FromSlash(worker.BenchKey)))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := results.ReadBench(bytes.NewReader(b))
	if err != nil || len(rows) != 1 {
		t.Fatalf("bench rows %+v, %v; want one", rows, err)
	}
	row := rows[0]
	if row.Model != "tiny" || row.Batch != 2 || row.Seq != 16 || row.Accumulate != 4 || row.Precision != "fp32" || row.TokPerSec <= 0 || row.Error != "" {
		t.Fatalf("bench row %+v; want pilot-cpu's step (tiny, 2 x 4 micro-batches, fp32) at --seq 16", row)
	}
	out, _, _ = sched(t, env, "results", "bench")
	if !regexp.MustCompile(`\| tiny +\| 4096 +\| 64 +\| 2 +\| - +\| 2 +\| 16 +\| 4 +\| fp32 +\| - +\|`).MatchString(out) {
		t.Errorf("sched results bench does not show the run's step:\n%s", out)
	}
}

// The bench sweep on a worker where no GPU starts (the README's CPU day)
// is archived at once, saying why and what to measure instead, where it
// ran its GPU shapes on the CPU, holding the gpu queue for hours.
func TestTheSweepOnAWorkerWithoutAGPUIsRefused(t *testing.T) {
	t.Parallel()
	if cuda.Devices() > 0 {
		t.Skip("a GPU is present; this test covers machines without one")
	}
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + t.TempDir()}
	out, errOut, code := sched(t, env, "enqueue", "bench", "sweep")
	m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue bench sweep: exit %d, %q %q", code, out, errOut)
	}
	startWorker(t, env, "--queues", "gpu=1")
	out = waitStatus(t, env, m[1], regexp.MustCompile(`archived`), time.Minute)
	for _, want := range []string{"the sweep measures the GPU's shapes", "hours on a CPU, and this worker trains on the CPU (", "'sched enqueue bench RUN' (pilot-cpu, demo)"} {
		if !strings.Contains(out, want) {
			t.Errorf("sched status %s lacks %q:\n%s", m[1], want, out)
		}
	}
}

// A worker (re)started while object storage is down starts anyway, saying
// so, rather than exiting: under compose or systemd it would crash-loop
// until the store came back, and its running segment could not train on
// from its disk as operations.md says. Once the store answers, its tasks
// use it.
func TestAWorkerStartsWhileObjectStorageIsDown(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	srv := testsvc.S3(t)
	srv.Stop()
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + t.TempDir(),
		"KILN_S3_ENDPOINT=" + srv.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey}
	startWorkerWithoutObjectStorage(t, env, "gpu=1,append=1")
	srv.Start()
	out, errOut, code := sched(t, env, "enqueue", "bench", "tiny", "--engine", "cpu", "--batch", "1", "--seq", "16", "--steps", "2", "--warmup", "0")
	m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue: exit %d, %q %q", code, out, errOut)
	}
	waitStatus(t, env, m[1], regexp.MustCompile(`^`+m[1]+`\s+completed\s+100\.0%`), 3*time.Minute)
	if out, _, _ = sched(t, env, "results", "bench"); !regexp.MustCompile(`\| tiny +\|`).MatchString(out) {
		t.Errorf("sched results bench has no row from the worker's store:\n%s", out)
	}
}

// startWorkerWithoutObjectStorage starts a worker of queues while the
// object storage env names does not answer, and returns once the worker
// says it starts anyway.
func startWorkerWithoutObjectStorage(t *testing.T, env []string, queues string) *exec.Cmd {
	t.Helper()
	w := startWorker(t, env, "--queues", queues)
	deadline := time.Now().Add(3 * time.Minute) // for a line that never comes
	for log := workerLog(t, w); !strings.Contains(log, "object storage does not answer; the worker starts"); log = workerLog(t, w) {
		if strings.Contains(log, "cannot reach the object store") || time.Now().After(deadline) {
			t.Fatalf("the worker did not start without object storage:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return w
}

func TestEnqueueBenchBadInput(t *testing.T) {
	t.Parallel()
	env := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"enqueue", "bench", "sweep", "--batch", "4"}, "the sweep has its own shapes"},
		{[]string{"enqueue", "bench", "tiny", "--seq", "-3"}, "--seq -3"},
		{[]string{"enqueue", "bench", "tiny", "--accumulate", "0"}, "--accumulate 0"},
		{[]string{"enqueue", "bench", "tiny", "--warmup", "-3"}, "--warmup -3: give 0 or more"},
		{[]string{"enqueue", "bench", "tiny", "--warmup", "-1"}, "--warmup -1: give 0 or more"},
		{[]string{"enqueue", "bench", "tiny", "--warmup", "some"}, `"some" is not a whole number`},
		{[]string{"enqueue", "bench", "tiny", "--precision", "fp16"}, `--precision "fp16": use bf16 or fp32`},
		{[]string{"enqueue", "bench", "sweep", "--accumulate", "4"}, "the sweep has its own"},
		{[]string{"enqueue", "bench", "pilot-gpu"}, `"pilot-gpu" is neither a model (base, small, tiny) nor a run (demo, long, pilot, pilot-cpu`},
	} {
		_, errOut, code := sched(t, env, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

// TestMalformedPayloadIsArchivedNotRetried enqueues raw bytes under a real
// kind: the worker archives the task with a one-line error at once.
func TestMalformedPayloadIsArchivedNotRetried(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json"}
	startWorker(t, env, "--queues", "gpu=1,ingest=1")
	opt, _ := asynq.ParseRedisURI(r.URL(0))
	c := asynq.NewClient(opt)
	defer c.Close()
	ids := map[string]string{}
	for name, task := range map[string]*asynq.Task{
		"raw bytes":       asynq.NewTask(scheduler.KindBenchRun, []byte("\x00\x01 not a payload"), asynq.Queue(scheduler.QueueGPU), asynq.MaxRetry(10)),
		"unbuilt kind":    asynq.NewTask(scheduler.KindTokenizerTrain+"-never", []byte("{}"), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(10)),
		"wrong arg types": asynq.NewTask(scheduler.KindBenchRun, []byte(`{"v":1,"args":{"model":7}}`), asynq.Queue(scheduler.QueueGPU), asynq.MaxRetry(10)),
	} {
		info, err := c.Enqueue(task)
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = info.ID
	}
	for name, id := range ids {
		out := waitStatus(t, env, id, regexp.MustCompile(`archived`), time.Minute)
		if !strings.Contains(out, "last error: ") || strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%s: status %q; want one line with the error", name, out)
		}
		insp := asynq.NewInspector(opt)
		for _, q := range []string{scheduler.QueueGPU, scheduler.QueueIngest} {
			if ti, err := insp.GetTaskInfo(q, id); err == nil && ti.Retried != 0 {
				t.Errorf("%s: retried %d times; a payload that cannot be read must not be retried", name, ti.Retried)
			}
		}
		insp.Close()
	}
}

// BenchmarkEnqueueIngestShards measures `sched enqueue`'s path for 10,000
// ingest:shard tasks: one at a time, and with overlapping round trips.
func BenchmarkEnqueueIngestShards(b *testing.B) {
	r := testsvc.StartRedis(b)
	opt, _ := asynq.ParseRedisURI(r.URL(0))
	q := scheduler.NewClient(opt)
	defer q.Close()
	const n = 10000
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("concurrency=%d", conc), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				args := make([]scheduler.Args, n)
				for j := range args {
					args[j] = scheduler.IngestShard{Dataset: "bench", Path: fmt.Sprintf("data/%d-%d-%d.parquet", conc, i, j), Store: "bench", Tokenizer: "t"}
				}
				res, err := q.EnqueueMany(context.Background(), args, conc)
				if err != nil || res.Enqueued != n {
					b.Fatalf("%+v, %v", res, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/task")
		})
	}
}

// `sched worker` with KILN_REQUIRE_GPU=1, as compose runs its GPU worker,
// on a machine where the CUDA engine cannot start: a bench of the default
// engine is archived at once in the worker's task process, naming the
// setting, the reason and the docs; one that names the CPU engine still
// runs there.
func TestWorkerThatRequiresAGPUSaysWhyItArchivesAutoWork(t *testing.T) {
	t.Parallel()
	if cuda.Devices() > 0 {
		t.Skip("a GPU is present; this test covers machines without one")
	}
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + t.TempDir(), "KILN_REQUIRE_GPU=1"}
	enqueue := func(args ...string) string {
		t.Helper()
		out, errOut, code := sched(t, env, append([]string{"enqueue", "bench", "tiny", "--batch", "1", "--seq", "16", "--steps", "2", "--warmup", "0"}, args...)...)
		m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("enqueue: exit %d, %q %q", code, out, errOut)
		}
		return m[1]
	}
	auto, cpu := enqueue(), enqueue("--engine", "cpu")
	w := startWorker(t, env, "--queues", "gpu=1")
	out := waitStatus(t, env, auto, regexp.MustCompile(`archived`), time.Minute)
	waitStatus(t, env, cpu, regexp.MustCompile(`completed\s+100\.0%`), time.Minute)
	for _, want := range []string{"KILN_REQUIRE_GPU", "does not fall back to the CPU", "The GPU worker's host"} {
		if !strings.Contains(out, want) {
			t.Errorf("sched status %s lacks %q:\n%s", auto, want, out)
		}
	}
	if out, _, _ := sched(t, env, "runs"); !regexp.MustCompile(auto + `\s+archived\s+failed for good after 1 attempt`).MatchString(out) {
		t.Errorf("sched runs does not say %s failed at once:\n%s", auto, out)
	}
	// The worker said so at its start, before any task.
	if log := workerLog(t, w); !regexp.MustCompile(`"level":"warn".*this worker requires a GPU \(KILN_REQUIRE_GPU\) and none starts here`).MatchString(log) {
		t.Errorf("the worker's log does not say at its start that no GPU starts:\n%s", log)
	}
}

// A GPU worker whose runs file cannot be read is refused at its start,
// naming KILN_RUNS, instead of archiving every segment it takes.
func TestAGPUWorkerRefusesAnUnreadableRunsFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "runs.yaml")
	if err := os.WriteFile(bad, []byte("mine:\n  model: small\n  steps: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{bad, dir, filepath.Join(dir, "nosuch.yaml")} {
		wantBadInput(t, append(baseEnv(t), "KILN_RUNS="+file), `^sched: KILN_RUNS: .*; mend it, then start the worker again`, "worker", "--queues", "gpu=1")
	}
	// A worker of the CPU queues reads no runs file.
	env := append(baseEnv(t), "KILN_RUNS="+bad, "KILN_REDIS_URL=redis://127.0.0.1:1/0")
	if _, errOut, code := sched(t, env, "worker", "--queues", "ingest=1"); code != exitBadInput || strings.Contains(errOut, "KILN_RUNS") {
		t.Fatalf("ingest worker with a bad runs file: exit %d, %s; want Redis's refusal, not the runs file's", code, errOut)
	}
}

// A worker ends on SIGTERM (how compose and systemd stop it) or Ctrl-C
// once its tasks have stopped, and that is its way to end, not a failure:
// exit 0, as the README says, where a command stopped mid-work exits 130.
func TestAWorkerStoppedBySignalExitsZero(t *testing.T) {
	t.Parallel()
	env := []string{"KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0", "KILN_DATA_DIR=" + t.TempDir(), "KILN_LOG_FORMAT=json"}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		w := startWorker(t, env, "--queues", "ingest=1")
		waitUntil(t, "the worker to start", func() bool { return strings.Contains(workerLog(t, w), `"msg":"worker started"`) })
		if err := w.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		err := w.Wait()
		if code := w.ProcessState.ExitCode(); code != 0 || !strings.Contains(workerLog(t, w), `"msg":"worker stopped"`) {
			t.Fatalf("a worker sent %v: exit %d (%v), log:\n%s\nwant exit 0 after \"worker stopped\"", sig, code, err, workerLog(t, w))
		}
	}
}
