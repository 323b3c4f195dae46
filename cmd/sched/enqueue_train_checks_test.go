package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// s3TrainingSetup is trainingSetupStore over a real S3 server: env names
// it, and objects writes to it as the workers do.
func s3TrainingSetup(t *testing.T, storeName string) (env []string, rdb *redis.Client, q *scheduler.Client, objects store.Store) {
	t.Helper()
	env, rdb, q = trainingSetupStore(t, storeName)
	s3 := testsvc.S3(t)
	env = append(env, "KILN_S3_ENDPOINT="+s3.Endpoint, "KILN_S3_ACCESS_KEY="+s3.AccessKey, "KILN_S3_SECRET_KEY="+s3.SecretKey)
	objects, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	return env, rdb, q, objects
}

// putStatus writes token store name's status into object storage, as the
// worker that appends it does.
func putStatus(t *testing.T, objects store.Store, name string, st ingest.StoreStatus) {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(context.Background(), ingest.StatusKey(name), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// setupTokenizer is trainingSetup's tokenizer tk, as a store made by it
// records it.
func setupTokenizer(t *testing.T, env []string) tokens.Tokenizer {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "tk", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tk, err := tokenizer.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return tokens.Tokenizer{Name: "tk", SHA256: tk.SHA256(), VocabSize: tk.VocabSize()}
}

// A run whose tokenizer is not the one that made a store of its mixture
// (as the store's status records it) is refused at enqueue, naming the
// run, the store, both tokenizers and what to do, where it was queued and
// failed on the worker; pinned to the store's tokenizer it is queued. A
// store being filled by an ingest of the run's tokenizer is accepted as
// before, and one being filled by another's is refused.
func TestEnqueueTrainRefusesAStoreOfAnotherTokenizer(t *testing.T) {
	t.Parallel()
	env, _, q, objects := s3TrainingSetup(t, "")
	ctx := context.Background()
	tk := setupTokenizer(t, env)
	other, otherSHA := trainTestTokenizer(t, "the quick brown fox jumps over the lazy dog\n")
	b, err := os.ReadFile(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(ctx, catalog.Key("t512b"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	t512b := tokens.Tokenizer{Name: "t512b", SHA256: otherSHA, VocabSize: 280}
	putStatus(t, objects, "code", ingest.StoreStatus{Tokens: 400_000, Documents: 10, Shards: 1, Done: []string{"s0"}, Tokenizer: tk})
	putStatus(t, objects, "filling", ingest.StoreStatus{Tokenizer: t512b})
	appendRuns(t, env, "mis:\n  from: eta\n  tokenizer: t512b\n  mixture: [{store: code, weight: 1}]\n"+
		"fill:\n  from: eta\n  tokenizer: t512b\n  mixture: [{store: filling, weight: 1}]\n"+
		"fill-tk:\n  from: eta\n  mixture: [{store: filling, weight: 1}]\n")

	wantBadInput(t, env, fmt.Sprintf(`^sched: run mis trains with tokenizer t512b \(sha256 %.12s\) but its token store code was made by tokenizer tk \(sha256 %.12s\): `+
		`their ids mean different text; ingest the store's data with t512b into another store \('sched enqueue ingest <dataset> --store code-t512b --tokenizer t512b', then name that store in the run's mixture\), `+
		`or give the run tokenizer tk \(tokenizer: tk in its runs entry, or --tokenizer tk\)`, otherSHA, tk.SHA256),
		"enqueue", "train", "mis")
	if live, err := q.LiveSegment(ctx, "mis"); err != nil || live != nil {
		t.Fatalf("run mis refused, yet its segment %v is queued (%v)", live, err)
	}
	if a := queuedSegment(t, env, envValue(env, "KILN_REDIS_URL"), "mis", "--tokenizer", "tk"); a.Tokenizer != "tk" {
		t.Fatalf("enqueue train mis --tokenizer tk queued tokenizer %q; want tk pinned", a.Tokenizer)
	}

	if out, errOut, code := sched(t, env, "enqueue", "ingest", "fineweb-edu", "--store", "filling", "--tokenizer", "t512b"); code != 0 {
		t.Fatalf("enqueue ingest into store filling: exit %d %q %q", code, out, errOut)
	}
	if a := queuedSegment(t, env, envValue(env, "KILN_REDIS_URL"), "fill"); a.Run != "fill" {
		t.Fatalf("enqueue train fill queued %+v", a)
	}
	wantBadInput(t, env, `^sched: run fill-tk trains with tokenizer tk \(sha256 [0-9a-f]{12}\) but its token store filling was made by tokenizer t512b \(sha256 [0-9a-f]{12}\): .*or give the run tokenizer t512b`,
		"enqueue", "train", "fill-tk")

	// The run's tokenizer being made: its ids are not known yet, but its
	// name is, and a published name never names another tokenizer, so a
	// store that records another name is refused too, where the segment
	// was queued and archived by the worker. One that records no name (a
	// tokenizer file's) is left to the worker.
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "tnew", "--vocab", "512"); code != 0 {
		t.Fatalf("enqueue tokenizer tnew: exit %d %q %q", code, out, errOut)
	}
	putStatus(t, objects, "anon", ingest.StoreStatus{Tokens: 400_000, Documents: 10, Shards: 1, Done: []string{"s0"}, Tokenizer: tokens.Tokenizer{SHA256: otherSHA, VocabSize: 280}})
	appendRuns(t, env, "new:\n  from: eta\n  tokenizer: tnew\n  mixture: [{store: code, weight: 1}]\n"+
		"new-anon:\n  from: eta\n  tokenizer: tnew\n  mixture: [{store: anon, weight: 1}]\n")
	wantBadInput(t, env, `^sched: run new trains with tokenizer tnew \(being made\) but its token store code was made by tokenizer tk \(sha256 [0-9a-f]{12}\): `+
		`their ids mean different text; ingest the store's data with tnew into another store \('sched enqueue ingest <dataset> --store code-tnew --tokenizer tnew', .*or give the run tokenizer tk`,
		"enqueue", "train", "new")
	if live, err := q.LiveSegment(ctx, "new"); err != nil || live != nil {
		t.Fatalf("run new refused, yet its segment %v is queued (%v)", live, err)
	}
	if a := queuedSegment(t, env, envValue(env, "KILN_REDIS_URL"), "new-anon"); a.Run != "new-anon" {
		t.Fatalf("enqueue train new-anon queued %+v", a)
	}
}

// A store whose status says it is damaged (its worker found tokens.bin
// cut short) refuses a run over it and an ingest into it at enqueue,
// saying how it is damaged and what to do, where the ingest was queued
// and its plan took every file for stored.
func TestEnqueueRefusesADamagedStore(t *testing.T) {
	t.Parallel()
	env, _, q, objects := s3TrainingSetup(t, "")
	ctx := context.Background()
	tk := setupTokenizer(t, env)
	const damaged = "tokens.bin is truncated (2 of 800000 bytes); delete /data/tokens/code on gpu-host, then re-ingest it if you still need it"
	putStatus(t, objects, "code", ingest.StoreStatus{Tokens: 400_000, Documents: 10, Shards: 1, Done: []string{"s0"}, Tokenizer: tk, Damaged: damaged})
	appendRuns(t, env, "dmg:\n  from: eta\n  mixture: [{store: code, weight: 1}]\n")
	wantBadInput(t, env, `^sched: run dmg trains on token store code, which is damaged: `+regexp.QuoteMeta(damaged)+"\n$", "enqueue", "train", "dmg")
	if live, err := q.LiveSegment(ctx, "dmg"); err != nil || live != nil {
		t.Fatalf("run dmg refused, yet its segment %v is queued (%v)", live, err)
	}
	wantBadInput(t, env, `^sched: token store code is damaged: `+regexp.QuoteMeta(damaged)+"\n$", "enqueue", "ingest", "fineweb-edu", "--store", "code", "--tokenizer", "tk")
	if live, err := q.LiveIngest(ctx, "code"); err != nil || live != 0 {
		t.Fatalf("the ingest into store code refused, yet %d of its tasks are queued (%v)", live, err)
	}
}

// Enqueuing a run done at its total steps queues nothing and says so,
// whether Redis or only object storage says where the run is; given a
// longer total_steps in the runs file, the same run resumes from its last
// checkpoint, from either.
func TestEnqueueTrainSaysADoneRunIsDone(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	ctx := context.Background()
	short, long := "fin:\n  from: eta\n  total_steps: 40\n", "fin:\n  from: eta\n  total_steps: 60\n"
	appendRuns(t, env, short)
	trainToTheEnd(t, env, rdb, q, "fin")

	// sched retry of its last, completed segment says the same.
	snap, err := q.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	for _, ts := range snap.Tasks {
		if a, err := scheduler.DecodeTask[scheduler.TrainSegment](ts.Payload); ts.Kind == scheduler.KindTrainSegment && err == nil && a.Run == "fin" && ts.State == "completed" {
			last = ts.ID
		}
	}
	if last == "" {
		t.Fatal("run fin has no completed segment to retry")
	}
	if out, errOut, code := sched(t, env, "retry", last); code != 0 || !strings.HasPrefix(out, "run fin is done at step 40 of 40; nothing queued") {
		t.Fatalf("retry %s of a done run: exit %d, %q %q; want it said done and nothing queued", last, code, out, errOut)
	}
	if live, err := q.LiveSegment(ctx, "fin"); err != nil || live != nil {
		t.Fatalf("retry of a done run's segment queued %v (%v)", live, err)
	}

	length := func(from, to string) { t.Helper(); editRuns(t, env, from, to) }
	done := "run fin is done at step 40 of 40; nothing queued (to train it further, give it a longer total_steps or total_tokens in a runs file, named by KILN_RUNS here and on the GPU worker, and enqueue it again; or train a run of another name)\n"
	// Without its record in Redis, it says too that the worker may hold a
	// newer checkpoint on its disk.
	resumed := regexp.MustCompile(`^queued train:segment:\S+ on gpu; the run resumes from its last checkpoint \(step 40(, the newest in object storage, or a newer one where the GPU worker's disk holds one: Redis holds no record of the run, .*)?\)\n$`)
	for _, when := range []string{"with its state in Redis", "after Redis lost its data"} {
		out, errOut, code := sched(t, env, "enqueue", "train", "fin")
		if code != 0 || out != done {
			t.Fatalf("enqueue train fin %s: exit %d, %q %q; want %q", when, code, out, errOut, done)
		}
		if live, err := q.LiveSegment(ctx, "fin"); err != nil || live != nil {
			t.Fatalf("enqueue train fin %s queued %v (%v); want nothing queued", when, live, err)
		}
		length(short, long)
		out, errOut, code = sched(t, env, "enqueue", "train", "fin")
		if code != 0 || !resumed.MatchString(out) {
			t.Fatalf("enqueue train fin %s, with total_steps 60: exit %d, %q %q; want it queued from step 40", when, code, out, errOut)
		}
		// Without its record in Redis, the run's line says where the
		// segment queued resumes.
		if out, _, _ := sched(t, env, "runs"); when == "after Redis lost its data" && lineOf(out, "fin  ") != "fin  queued  from checkpoint step 40" {
			t.Errorf("sched runs %s, the run queued again: %q; want it queued from checkpoint step 40\n%s", when, lineOf(out, "fin  "), out)
		}
		// The segment queued, and the run's state, go with Redis's data.
		length(long, short)
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// trainToTheEnd queues run on a worker of its own and returns once the run
// is done and its last segment completed, the worker stopped: nothing
// trains what is queued after it.
func trainToTheEnd(t *testing.T, env []string, rdb *redis.Client, q *scheduler.Client, run string) {
	t.Helper()
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", run); code != 0 {
		t.Fatalf("enqueue train %s: exit %d: %s%s", run, code, out, errOut)
	}
	waitUntil(t, "run "+run+" done, its last segment completed", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, run)
		live, lerr := q.LiveSegment(ctx, run)
		return err == nil && ok && st.Done && lerr == nil && live == nil
	})
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
}

// A runs entry changed to a model layout, a sequence length or a seed its
// checkpoints cannot be resumed with is refused at enqueue, naming both
// and what to do, where the worker would refuse the segment it queued;
// put back, the run resumes.
func TestEnqueueTrainRefusesAShapeItsCheckpointsCannotResume(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	ctx := context.Background()
	appendRuns(t, env, "shp:\n  from: eta\n  total_steps: 40\n")
	trainToTheEnd(t, env, rdb, q, "shp")
	was := "shp:\n  from: eta\n  total_steps: 40\n"
	entry := func(body string) { t.Helper(); editRuns(t, env, was, body); was = body }
	entry("shp:\n  from: eta\n  total_steps: 60\n  seq: 64\n")
	wantBadInput(t, env, `^sched: run shp trained at seq 32 and its runs entry now gives seq 64, which its checkpoints' data order cannot resume: put its entry back as it was in the runs file \(KILN_RUNS\), or train a run of another name`,
		"enqueue", "train", "shp")
	entry("shp:\n  from: eta\n  total_steps: 60\n  seed: 7\n")
	wantBadInput(t, env, `^sched: run shp trained with seed \d+ and its runs entry now gives seed 7, which its checkpoints' data order cannot resume: put its entry back as it was in the runs file \(KILN_RUNS\), or train a run of another name`,
		"enqueue", "train", "shp")
	entry("shp:\n  from: eta\n  total_steps: 60\n  model: small\n")
	wantBadInput(t, env, `^sched: run shp's checkpoints hold a model of another layout than its runs entry now gives, vocab \d+ \(this run's: vocab \d+\), d_model 64 \(this run's: d_model 512\), .*: put its entry back as it was`,
		"enqueue", "train", "shp")
	if live, err := q.LiveSegment(ctx, "shp"); err != nil || live != nil {
		t.Fatalf("a refused enqueue queued %v (%v)", live, err)
	}
	entry("shp:\n  from: eta\n  total_steps: 60\n")
	if out, errOut, code := sched(t, env, "enqueue", "train", "shp"); code != 0 || !strings.Contains(out, "resumes from its last checkpoint (step 40)") {
		t.Fatalf("enqueue train shp put back, with total_steps 60: exit %d, %q %q; want it queued from step 40", code, out, errOut)
	}
}

// A store whose files were copied onto the appending worker's disk (a
// backup put back) has no status in object storage until that worker
// starts: enqueue says, after the ingest to run, that restarting that
// worker records the store, and once it has, the run is queued.
func TestEnqueueTrainSaysACopiedStoreIsRecordedByARestart(t *testing.T) {
	t.Parallel()
	env, _, _, objects := s3TrainingSetup(t, "copied")
	ctx := context.Background()
	// The operator's machine: another data directory, the tokenizer in
	// object storage.
	b, err := os.ReadFile(filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "tk", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(ctx, catalog.Key("tk"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	op := append(append([]string{}, env...), "KILN_DATA_DIR="+t.TempDir())

	wantBadInput(t, op, `^sched: run eta trains on token store copied, which holds no tokens and which no ingest is filling: run 'sched enqueue ingest <dataset> --store copied' first \('sched status' shows an ingest that failed\); `+
		`if its files were copied onto the worker's disk, restarting the worker that serves the append queue records them\n$`,
		"enqueue", "train", "eta")

	startWorker(t, env, "--queues", "append=1")
	waitUntil(t, "the appending worker's start recording store copied in object storage", func() bool {
		st, err := (&ingest.Pipeline{Objects: objects}).Status(ctx, "copied")
		return err == nil && st.Tokens > 0
	})
	if a := queuedSegment(t, op, envValue(env, "KILN_REDIS_URL"), "eta"); a.Run != "eta" {
		t.Fatalf("enqueue train eta queued %+v", a)
	}
}

// A run with no checkpoint yet (its first segment died before one) starts
// afresh, so any shape may be queued for it; with one, the shape its state
// records is held to.
func TestCheckShapeHoldsOnlyARunWithACheckpoint(t *testing.T) {
	set, err := runs.Load("")
	if err != nil {
		t.Fatal(err)
	}
	run, err := set.Get("pilot-cpu")
	if err != nil {
		t.Fatal(err)
	}
	st := scheduler.RunState{Run: "pilot-cpu", Step: 15, Seq: run.Seq * 2, Shape: "another model"}
	if err := checkShape(run, st, true, 0); err != nil {
		t.Errorf("a run with no checkpoint, its shape changed: %v; want it queued", err)
	}
	if err := checkShape(run, st, true, 10); err == nil || !isBadInput(err) {
		t.Errorf("a run with a checkpoint at step 10, its seq changed: %v; want it refused", err)
	}
	st.Seq = run.Seq
	if err := checkShape(run, st, true, 10); err == nil || !strings.Contains(err.Error(), "checkpoints hold a model of another layout than its runs entry now gives, another model (this run's: vocab ") {
		t.Errorf("a run with a checkpoint at step 10, its model changed: %v; want it refused", err)
	}
	st.Shape = ""
	if err := checkShape(run, st, true, 10); err != nil {
		t.Errorf("a state of an earlier kiln, with no shape: %v; want it queued", err)
	}
	st.Seed, st.HasSeed = run.Seed+1, true
	if err := checkShape(run, st, true, 10); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("trained with seed %d and its runs entry now gives seed %d", run.Seed+1, run.Seed)) {
		t.Errorf("a run with a checkpoint at step 10, its seed changed: %v; want it refused", err)
	}
	if err := checkShape(run, st, true, 0); err != nil {
		t.Errorf("a run with no checkpoint, its seed changed: %v; want it queued", err)
	}
	st.Seed = run.Seed
	if err := checkShape(run, st, true, 10); err != nil {
		t.Errorf("a run with a checkpoint at step 10, its seed as it was: %v; want it queued", err)
	}
}

// A run cancelled short of its total whose runs entry then ends it at or
// before its checkpoint is ended there by the segment sched enqueue train
// queues, its results judged. Before, enqueue said the run was done and
// queued nothing, while the run stayed cancelled, its gates pending, for
// good.
func TestACancelledRunShortenedBelowItsCheckpointIsEndedThere(t *testing.T) {
	t.Parallel()
	env, rdb, q, objects := s3TrainingSetup(t, "")
	ctx := context.Background()
	appendRuns(t, env, "cut:\n  from: eta\n")
	w := startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "cut"); code != 0 {
		t.Fatalf("enqueue train cut: exit %d: %s%s", code, out, errOut)
	}
	waitUntil(t, "run cut's first checkpoint", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "cut")
		return err == nil && ok && st.Checkpoint > 0
	})
	if out, errOut, code := sched(t, env, "cancel", waitRunningSegment(t, q)); code != 0 {
		t.Fatalf("cancel: exit %d: %s%s", code, out, errOut)
	}
	waitUntil(t, "run cut's segment ended by the cancel", func() bool {
		live, err := q.LiveSegment(ctx, "cut")
		return err == nil && live == nil
	})
	st, ok, err := scheduler.ReadRunState(ctx, rdb, "cut")
	if err != nil || !ok || st.Done || st.Checkpoint <= 0 {
		t.Fatalf("run cut after its cancel: %+v (%v, %v); want a checkpoint, not done", st, ok, err)
	}
	at := st.Checkpoint
	editRuns(t, env, "cut:\n  from: eta\n", fmt.Sprintf("cut:\n  from: eta\n  total_steps: %d\n", at))
	out, errOut, code := sched(t, env, "enqueue", "train", "cut")
	// The checkpoint its stop wrote may be recorded after the cancel ended
	// the task: the run is at step at or after it; the enqueue waits for
	// a stop still under way, and says so.
	want := regexp.MustCompile(fmt.Sprintf(`^(train:segment:\S+ was cancelled and is still stopping \(.*\n)?queued train:segment:\S+ on gpu; the run resumes from its last checkpoint \(step \d+\)\n`+
		`its total_steps %d is at or before that checkpoint: the segment trains no step, and ends the run there, judging its results\n$`, at))
	if code != 0 || !want.MatchString(out) {
		t.Fatalf("enqueue train cut with total_steps %d, its checkpoint's step: exit %d, %q %q; want a segment queued to end it", at, code, out, errOut)
	}
	waitUntil(t, "run cut done", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "cut")
		live, lerr := q.LiveSegment(ctx, "cut")
		return err == nil && ok && st.Done && lerr == nil && live == nil
	})
	steps, err := segment.RemoteSteps(ctx, objects, "cut")
	if err != nil || len(steps) == 0 {
		t.Fatalf("run cut's checkpoints in object storage: %v, %v", steps, err)
	}
	if st, _, _ := scheduler.ReadRunState(ctx, rdb, "cut"); st.Step < at || st.Step != steps[len(steps)-1] {
		t.Errorf("run cut ended at step %d; want its newest checkpoint's, %d, which its cancel wrote (at step %d or after)", st.Step, steps[len(steps)-1], at)
	}
	rc, err := objects.Get(ctx, segment.ResultsPrefix("cut")+results.SummaryFile)
	if err != nil {
		t.Fatal(err)
	}
	summary, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(summary), "pending") {
		t.Errorf("run cut's results, after it ended, still wait for its end:\n%s", summary)
	}
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
}

// A done run given a longer total, whose next segment is refused (its
// runs entry changed its seed as well), reads failed with the reason in
// sched runs and sched status, where it read done.
func TestADoneRunWhoseLongerSegmentFailsReadsFailed(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	ctx := context.Background()
	appendRuns(t, env, "fin:\n  from: eta\n  total_steps: 40\n")
	trainToTheEnd(t, env, rdb, q, "fin")
	editRuns(t, env, "fin:\n  from: eta\n  total_steps: 40\n", "fin:\n  from: eta\n  total_steps: 60\n")
	if out, errOut, code := sched(t, env, "enqueue", "train", "fin"); code != 0 {
		t.Fatalf("enqueue train fin with total_steps 60: exit %d: %s%s", code, out, errOut)
	}
	// Edited again before the worker reads it: a seed no resume may take,
	// which the worker refuses (sched enqueue train would have).
	editRuns(t, env, "fin:\n  from: eta\n  total_steps: 60\n", "fin:\n  from: eta\n  total_steps: 60\n  seed: 4\n")
	w := startWorker(t, env, "--queues", "gpu=1")
	waitUntil(t, "run fin's segment past its end refused", func() bool {
		snap, err := q.Snapshot(ctx)
		return err == nil && snap.RunTasks()["fin"].Task.State == "archived"
	})
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	for _, cmd := range []string{"runs", "status"} {
		out, errOut, code := sched(t, env, cmd)
		if l := lineOf(out, "fin  "); code != 0 || !strings.HasPrefix(l, "fin  failed  step 40/40") || !strings.Contains(l, "run fin: resume from step 40: ") {
			t.Errorf("sched %s: exit %d, run fin's line %q (%s); want it failed at step 40, saying why", cmd, code, l, errOut)
		}
	}
	// Its runs entry put back, as operations.md says, the run is done at
	// its total: enqueue says so and drops the refused segment, and status
	// reads done, where it read failed for the archive's 30 days.
	snap, err := q.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := snap.RunTasks()["fin"].Task.ID
	editRuns(t, env, "fin:\n  from: eta\n  total_steps: 60\n  seed: 4\n", "fin:\n  from: eta\n  total_steps: 40\n")
	// sched retry of the refused segment does as enqueue train does.
	for _, args := range [][]string{{"retry", id}, {"enqueue", "train", "fin"}} {
		out, errOut, code := sched(t, env, args...)
		want := "run fin is done at step 40 of 40; nothing queued"
		if args[0] == "retry" {
			want = "the segment that was to train run fin past step 40, and failed or was cancelled, is dropped: " + id + "\n" + want
		}
		if code != 0 || !strings.HasPrefix(out, want) {
			t.Fatalf("%v, its entry put back: exit %d %q %q; want %q", args, code, out, errOut, want)
		}
	}
	for _, cmd := range []string{"runs", "status"} {
		out, errOut, code := sched(t, env, cmd)
		if l := lineOf(out, "fin  "); code != 0 || !strings.HasPrefix(l, "fin  done  step 40/40") {
			t.Errorf("sched %s after the entry was put back: exit %d, run fin's line %q (%s); want it done", cmd, code, l, errOut)
		}
	}
}

// A segment cancelled as it waited is said to be archived, not stopped,
// and its run, which has no checkpoint, is said to start again, where
// both spoke of a checkpoint it never wrote.
func TestASegmentCancelledAsItWaitedSaysNoCheckpoint(t *testing.T) {
	t.Parallel()
	env, _, _, _ := s3TrainingSetup(t, "")
	appendRuns(t, env, "wait:\n  from: eta\n")
	out, errOut, code := sched(t, env, "enqueue", "train", "wait")
	id := regexp.MustCompile(`train:segment:[0-9a-f]+`).FindString(out)
	if code != 0 || id == "" {
		t.Fatalf("enqueue train wait: exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "cancel", id); code != 0 || out != id+" cancelled: archived while it waited to run; it will not run\n" {
		t.Fatalf("cancel %s as it waited: exit %d %q %q", id, code, out, errOut)
	}
	out, _, _ = sched(t, env, "runs")
	if l := lineOf(out, "wait  "); l != "wait  cancelled  by sched cancel, before its first checkpoint; 'sched enqueue train wait' starts it" {
		t.Errorf("sched runs, the run cancelled before it began: %q\n%s", l, out)
	}
	// Enqueued again, it starts: it has no checkpoint to resume from.
	if out, errOut, code := sched(t, env, "enqueue", "train", "wait"); code != 0 || out != "queued "+id+" on gpu again (it had been cancelled by sched cancel); the run starts at step 0, having no checkpoint\n" {
		t.Errorf("enqueue train wait after its cancel: exit %d %q %q; want it queued again, starting at step 0", code, out, errOut)
	}
}
