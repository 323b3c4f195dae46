package main

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/scheduler"
)

// A run whose runs entry changed its seq mid-run is refused for the seq,
// which no ingest mends, though its store holds no held-out window of the
// new length: before, enqueue said to ingest more (or set eval_every 0),
// and only once the user had done so did it name the seq.
func TestEnqueueTrainRefusesAChangedSeqBeforeTheHeldOutWindow(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	// 150,000 ids: 4545 windows of 33, some held out; 2307 of 65, none
	// (the first held out is window 3615).
	mid := trainTestStoreBy(t, setupTokenizer(t, env).SHA256, 280, 150_000)
	was := fmt.Sprintf("mid:\n  from: eta\n  total_steps: 40\n  eval_every: 20\n  eval_batches: 1\n  mixture: [{store: %s, weight: 1}]\n", mid)
	appendRuns(t, env, was)
	trainToTheEnd(t, env, rdb, q, "mid")
	editRuns(t, env, was, strings.Replace(was, "total_steps: 40\n", "total_steps: 60\n  seq: 64\n", 1))
	wantBadInput(t, env, `^sched: run mid trained at seq 32 and its runs entry now gives seq 64, which its checkpoints' data order cannot resume: put its entry back`,
		"enqueue", "train", "mid")
}

// A store of the mixture too small for a held-out window is named at
// enqueue, with what it holds and what it needs, and that the run's eval
// loss and its gates leave it out; the run is queued (another store holds
// one). Before, nothing said so, and the results' mixed eval loss was the
// other store's alone.
func TestEnqueueTrainNamesAStoreWithoutAHeldOutWindow(t *testing.T) {
	t.Parallel()
	env, _, _ := trainingSetup(t)
	sha := setupTokenizer(t, env).SHA256
	big, small := trainTestStoreBy(t, sha, 280, 400_000), trainTestStoreBy(t, sha, 280, 50_000)
	appendRuns(t, env, fmt.Sprintf("two:\n  from: eta\n  eval_every: 20\n  eval_batches: 1\n  mixture: [{store: %s, weight: 2}, {store: %s, weight: 1}]\n", big, small))
	out, errOut, code := sched(t, env, "enqueue", "train", "two")
	want := regexp.MustCompile(`^queued train:segment:\S+ on gpu\n` +
		regexp.QuoteMeta(fmt.Sprintf("note: token store %s holds 50000 tokens, too few for a held-out window of run two (at seq 32 a store needs 119328): the run's eval loss, and the gates judged on it, leave that store out until it holds them; ingest more into it", small)) +
		`.*\n$`)
	if code != 0 || !want.MatchString(out) {
		t.Fatalf("enqueue train two: exit %d, %q %q; want it queued, with a note naming store %s", code, out, errOut, small)
	}
	if strings.Contains(out, big) {
		t.Errorf("enqueue train two names store %s, which holds held-out windows: %q", big, out)
	}
}

// sched retry of a segment makes the checks sched enqueue train makes: a
// segment archived as its run's tokenizer failed for good is refused,
// saying what to make first, where it was queued again to fail the same
// way. Its run mended, the segment is queued, and the line says the run
// starts at step 0, having no checkpoint, where it said that the run
// resumes from its last checkpoint.
func TestRetryOfASegmentChecksItsRunFirst(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetup(t)
	ctx := context.Background()
	// Its store records the tokenizer's name, as one ingested by it does
	// (and tk's ids, which the run trains with once it is mended).
	store := trainTestStoreNamed(t, "bad-512", setupTokenizer(t, env).SHA256, 280, 400_000)
	appendRuns(t, env, fmt.Sprintf("bad:\n  from: eta\n  tokenizer: bad-512\n  mixture: [{store: %s, weight: 1}]\n", store))
	if out, errOut, code := sched(t, env, "enqueue", "tokenizer", "bad-512", "--vocab", "512"); code != 0 {
		t.Fatalf("enqueue tokenizer bad-512: exit %d %q %q", code, out, errOut)
	}
	out, errOut, code := sched(t, env, "enqueue", "train", "bad")
	id := regexp.MustCompile(`train:segment:[0-9a-f]+`).FindString(out)
	if code != 0 || id == "" {
		t.Fatalf("enqueue train bad, its tokenizer being made: exit %d %q %q", code, out, errOut)
	}
	// The tokenizer's tasks fail for good, as a sample of a dataset that
	// cannot be read does; the segment is cancelled as it waits.
	opt, err := asynq.ParseRedisURI(envValue(env, "KILN_REDIS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	in := asynq.NewInspector(opt)
	defer in.Close()
	for _, queue := range []string{scheduler.QueueIngest, scheduler.QueueAppend} {
		if _, err := in.ArchiveAllPendingTasks(queue); err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
	}
	if live, err := q.LiveTokenizer(ctx, "bad-512"); err != nil || live != nil {
		t.Fatalf("tokenizer bad-512 still being made: %v, %v", live, err)
	}
	if out, errOut, code := sched(t, env, "cancel", id); code != 0 {
		t.Fatalf("cancel %s: exit %d %q %q", id, code, out, errOut)
	}

	wantBadInput(t, env, `^sched: run bad trains with tokenizer bad-512, which does not exist yet: make it first with 'sched enqueue tokenizer bad-512 --vocab 4096'`,
		"retry", id)
	if live, err := q.LiveSegment(ctx, "bad"); err != nil || live != nil {
		t.Fatalf("retry refused, yet the run's segment %v is queued (%v)", live, err)
	}

	editRuns(t, env, "tokenizer: bad-512\n", "tokenizer: tk\n")
	if out, errOut, code := sched(t, env, "retry", id); code != 0 || out != "queued "+id+" on gpu again (it had been cancelled by sched cancel); the run starts at step 0, having no checkpoint\n" {
		t.Errorf("retry %s, its run's tokenizer made: exit %d %q %q; want it queued again, starting at step 0", id, code, out, errOut)
	}
}
