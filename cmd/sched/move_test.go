package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/segment"
	"github.com/kiln-lm/kiln/worker"
)

// operations.md's move of a run to another machine: the old worker stops
// (SIGTERM: its checkpoint uploaded, the segment re-queued); the worker of
// a data directory without the run's token stores takes the segment,
// pulls the checkpoint and fails it when it opens its data, archived at
// once without using a retry, naming the store and what to do; with the
// store copied into its data directory, `sched enqueue train` resumes the
// run there from the checkpoint.
func TestARunMovedToAMachineWithoutItsStoresResumesOnceTheyAreCopied(t *testing.T) {
	t.Parallel()
	env, rdb, q, objects := s3TrainingSetup(t, "code")
	ctx := context.Background()
	oldData := envValue(env, "KILN_DATA_DIR")
	// The new machine reads the run's tokenizer from object storage.
	b, err := os.ReadFile(filepath.Join(oldData, "tokenizers", "tk", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(ctx, catalog.Key("tk"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}

	old := startWorker(t, env, "--queues", "gpu=1,append=1")
	waitUntil(t, "the old worker's start recording store code in object storage", func() bool {
		st, err := (&ingest.Pipeline{Objects: objects}).Status(ctx, "code")
		return err == nil && st.Tokens > 0
	})
	out, errOut, code := sched(t, env, "enqueue", "train", "eta")
	m := regexp.MustCompile(`queued (train:segment:\S+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue train eta: exit %d: %s%s", code, out, errOut)
	}
	seg := m[1]
	waitUntil(t, "run eta's checkpoint of step 20 uploaded", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "eta")
		return err == nil && ok && st.Checkpoint >= 20
	})
	if err := old.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = old.Wait()
	steps, err := segment.RemoteSteps(ctx, objects, "eta")
	if err != nil || len(steps) == 0 {
		t.Fatalf("checkpoints of run eta in object storage: %v, %v", steps, err)
	}
	newest := steps[len(steps)-1]

	// The stores' machine goes on appending: the new machine's failure
	// names it, where it said to ingest into the store, which would fill
	// the old machine's.
	appender := startWorker(t, env, "--queues", "append=1")
	waitUntil(t, "the old machine's worker holding the append claim again", func() bool {
		h, err := worker.AppendHolderNow(ctx, rdb)
		return err == nil && h != nil && h.PID == appender.Process.Pid
	})
	newData := t.TempDir()
	newEnv := append(env[:len(env):len(env)], "KILN_DATA_DIR="+newData)
	w := startWorker(t, newEnv, "--queues", "gpu=1")
	var ts scheduler.TaskStatus
	// Re-queued by the stop, it waits as a retry that used none: the new
	// machine's failure archives it or uses one.
	waitUntil(t, "the segment failing on the new machine", func() bool {
		ts, err = q.Task(ctx, seg)
		return err == nil && (ts.State == "archived" || ts.Retried > 0)
	})
	store := filepath.Join(newData, "tokens", "code")
	// The store's status in object storage says it was ingested, on the
	// disk of the worker that appends: the error says so, and ends with
	// what to do, which the one-line views keep, not an ingest into it,
	// which would fill the old machine's store. The advice is said once.
	where := regexp.MustCompile(`^train:segment: run eta: token store ` + regexp.QuoteMeta(store) + ` is not on this worker's disk \(host \S+, data directory ` +
		regexp.QuoteMeta(newData) + `\), which has no manifest.json for it: its status in object storage says it holds \d+ tokens, ingested on the disk of the worker that appends \(host \S+, data directory ` +
		regexp.QuoteMeta(oldData) + ` \(pid \d+\)\); train on a GPU worker of that disk, or copy the store's folder here, then 'sched enqueue train eta' resumes the run( \(skip retry for the task\))?$`)
	if ts.State != "archived" || ts.Retried != 0 || !where.MatchString(ts.LastErr) {
		t.Fatalf("the segment on a machine without the store: %s after %d retries, %q; want it archived without a retry, naming %s, where the stores are (%s), what to copy and what to enqueue then",
			ts.State, ts.Retried, ts.LastErr, store, oldData)
	}
	remedy := "; train on a GPU worker of that disk, or copy the store's folder here, then 'sched enqueue train eta' resumes the run"
	for what, line := range map[string]string{"sched runs": failureErr(ts, 200), "sched status": failureErr(ts, listErrRunes)} {
		if strings.Contains(line, "ingest into it") {
			t.Errorf("%s's line of the failure: %q; want no ingest into it", what, line)
		}
		if !strings.Contains(line, remedy) {
			t.Errorf("%s's line of the failure: %q; want it to keep %q", what, line, remedy)
		}
	}
	// sched runs shows an error's first 200 characters; the task's own
	// status shows all of it, the advice at its end included.
	if out, errOut, code := sched(t, newEnv, "status", seg); code != 0 || !strings.Contains(out, "then 'sched enqueue train eta' resumes the run") {
		t.Fatalf("sched status %s: exit %d: %s%s; want all of its error", seg, code, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(newData, "runs", "eta", trainer.StepDir(newest))); err != nil {
		t.Fatalf("the checkpoint of step %d was not pulled before the data was opened: %v", newest, err)
	}

	if err := os.CopyFS(store, os.DirFS(filepath.Join(oldData, "tokens", "code"))); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, newEnv, "enqueue", "train", "eta")
	if code != 0 || !regexp.MustCompile(fmt.Sprintf(`the run resumes from its last checkpoint \(step %d[,)]`, newest)).MatchString(out) {
		t.Fatalf("enqueue train eta with the store copied: exit %d: %s%s; want it queued from step %d", code, out, errOut, newest)
	}
	resumed := regexp.MustCompile(fmt.Sprintf(`"msg":"resumed",.*"step":%d[,}]`, newest))
	waitUntil(t, fmt.Sprintf("the new machine resuming run eta from step %d", newest), func() bool {
		return resumed.MatchString(workerLog(t, w))
	})
	waitUntil(t, "the new machine training run eta past its checkpoint", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "eta")
		return err == nil && ok && st.Step > newest
	})
}
