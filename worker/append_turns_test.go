package worker

import (
	"bytes"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokens"
)

// appendChild starts the test binary as an append worker (append=1) of the
// stores in storesDir and the data directory dataDir, whose object store is
// at endpoint, with env added; it is killed when the test ends, and its log
// shown if the test failed.
func (e *ingestEnv) appendChild(endpoint, storesDir, dataDir string, env ...string) *exec.Cmd {
	t := e.t
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KILN_TEST_INGEST_WORKER=append=1", "KILN_TEST_REDIS_URL="+e.url,
		"KILN_TEST_S3_ENDPOINT="+endpoint, "KILN_TEST_S3_ACCESS="+e.s3.AccessKey, "KILN_TEST_S3_SECRET="+e.s3.SecretKey,
		"KILN_TEST_STORES="+storesDir, "KILN_TEST_DATA="+dataDir)
	cmd.Env = append(cmd.Env, env...)
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
			t.Logf("append worker %d log:\n%s", cmd.Process.Pid, b)
		}
		logf.Close()
	})
	return cmd
}

// appendTasks is every task of the append queue, with its progress.
func (e *ingestEnv) appendTasks() []scheduler.TaskStatus {
	e.t.Helper()
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	var out []scheduler.TaskStatus
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		insp.ListPendingTasks, insp.ListActiveTasks, insp.ListScheduledTasks, insp.ListRetryTasks, insp.ListArchivedTasks, insp.ListCompletedTasks,
	} {
		infos, _ := list(scheduler.QueueAppend, asynq.PageSize(1000))
		for _, ti := range infos {
			if ts, err := e.c.Task(context.Background(), ti.ID); err == nil {
				out = append(out, ts)
			}
		}
	}
	return out
}

// failedAppend is an append task whose attempt failed, or "": one that
// used a retry, or was archived, or waits for its next try after an
// error (a task set back to wait reads "waiting", and uses none).
func failedAppend(ts []scheduler.TaskStatus) string {
	for _, t := range ts {
		setBack := t.HasProgress && t.Progress.State == "waiting"
		if t.Retried > 0 || t.State == "archived" || (t.State == "retry" || t.State == "scheduled") && !setBack {
			return t.ID + " (" + t.State + ", retried " + strconv.Itoa(t.Retried) + "): " + t.LastErr
		}
	}
	return ""
}

// waitForAppend waits until an append task is as cond says, failing t at
// once should an append fail.
func (e *ingestEnv) waitForAppend(within time.Duration, what string, cond func(scheduler.TaskStatus) bool) scheduler.TaskStatus {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ts := e.appendTasks()
		if f := failedAppend(ts); f != "" {
			e.t.Fatalf("waiting for an append %s, one failed: %s", what, f)
		}
		for _, t := range ts {
			if cond(t) {
				return t
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no append %s within %v: %+v", what, within, ts)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// storeBySource is each input's token bytes in the store in dir, and the
// size of its tokens.bin.
func storeBySource(t *testing.T, dir string) (map[string][]byte, int64) {
	t.Helper()
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, tokens.TokensFile))
	if err != nil {
		t.Fatal(err)
	}
	w := int64(m.Dtype.Width())
	out := map[string][]byte{}
	for _, s := range m.Shards {
		out[s.Source] = append(out[s.Source], b[s.Offset*w:(s.Offset+s.Tokens)*w]...)
	}
	return out, int64(len(b))
}

// Two workers of one data directory serving append take turns at a store:
// an append that finds it locked by the other waits for the other's
// commit, saying so, rather than fail. No append fails or uses a retry,
// and the store holds the bytes one appender makes of every file.
//
// The first worker streams its shards into the store (no prefetch), and
// the object store holds its first shard's read: it holds the store's lock
// until the test lets the read through. The second worker starts then.
func TestTwoAppendWorkersOfOneDataDirectoryTakeTurns(t *testing.T) {
	e := newIngestEnv(t)
	e.addGoodFiles("turns", 6, 5, "")
	e.configure(t.TempDir(), "") // this process cannot append: it has no stores
	e.serve(map[string]int{scheduler.QueueIngest: 2})
	storesDir, dataDir := t.TempDir(), t.TempDir()
	faults := e.s3.Faults(t)
	first := e.appendChild(faults.Endpoint, storesDir, dataDir, "KILN_TEST_PREFETCH=-1")

	// One appender's store of the files.
	id := e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: "alone", Tokenizer: ingestTokenizer, Seed: 3})
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(time.Minute)

	held := faults.Add(testsvc.Fault{Method: "GET", Path: "tokens/turns/shards/", Action: testsvc.Hold, Count: 1})
	id = e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: "turns", Tokenizer: ingestTokenizer, Seed: 3})
	<-held.Held
	e.appendChild(e.s3.Endpoint, storesDir, dataDir)
	holder := "held by pid " + strconv.Itoa(first.Process.Pid)
	e.waitForAppend(time.Minute, "waiting for the store the first worker holds", func(ts scheduler.TaskStatus) bool {
		return ts.State == "active" && strings.Contains(ts.Progress.Message, "waiting for the lock of token store turns, "+holder)
	})
	faults.Clear()
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(2 * time.Minute)

	ts := e.appendTasks()
	if f := failedAppend(ts); f != "" {
		t.Fatalf("an append failed: %s", f)
	}
	if len(ts) != 12 {
		t.Fatalf("%d append tasks, want the 6 files' of each store", len(ts))
	}
	for _, task := range ts {
		if task.State != "completed" || task.Retried != 0 {
			t.Fatalf("append %s: %s, retried %d; want completed without a retry", task.ID, task.State, task.Retried)
		}
	}
	want, wantSize := storeBySource(t, filepath.Join(storesDir, "alone"))
	got, gotSize := storeBySource(t, filepath.Join(storesDir, "turns"))
	if len(got) != 6 || gotSize != wantSize || !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Fatalf("the store two appenders made holds %d files in %d bytes; one appender's %d in %d", len(got), gotSize, len(want), wantSize)
	}
	for src, b := range want {
		if !bytes.Equal(got[src], b) {
			t.Fatalf("the tokens of %s differ between the store two appenders made and one appender's", src)
		}
	}
	st, err := tokens.Open(filepath.Join(storesDir, "turns"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// An append whose store another process holds past the append's wait (a
// direct ingest holds its store for its whole run) is set back to wait,
// without using a retry, saying what holds it; once the store is free it
// is appended.
func TestAnAppendWhoseStoreStaysHeldWaits(t *testing.T) {
	e := newIngestEnv(t)
	e.addGoodFiles("held", 2, 3, "")
	e.configure(t.TempDir(), "")
	e.serve(map[string]int{scheduler.QueueIngest: 2})
	storesDir := t.TempDir()
	// This process holds the store, as a direct ingest would.
	eos, _ := e.tok.EOS()
	direct, err := tokens.OpenAppender(context.Background(), filepath.Join(storesDir, "held"),
		tokens.Tokenizer{Name: ingestTokenizer, SHA256: e.tok.SHA256(), VocabSize: e.tok.VocabSize(), EOS: eos}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	e.appendChild(e.s3.Endpoint, storesDir, t.TempDir(), "KILN_TEST_STORE_WAIT=1ms", "KILN_TEST_WAIT_EVERY=10ms")
	id := e.enqueue(scheduler.IngestPlan{Dataset: "corpus", Store: "held", Tokenizer: ingestTokenizer})
	waiting := e.waitForAppend(time.Minute, "set back to wait for the store", func(ts scheduler.TaskStatus) bool {
		return ts.HasProgress && ts.Progress.State == "waiting"
	})
	if want := "waiting for token store held, still locked by pid " + strconv.Itoa(os.Getpid()) + " after this append waited 1ms for it (a direct ingest"; !strings.Contains(waiting.Progress.Message, want) {
		t.Fatalf("an append set back to wait says %q; want %q", waiting.Progress.Message, want)
	}
	if err := direct.Close(); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, time.Minute, "completed", state("completed"))
	e.waitDrained(time.Minute)
	ts := e.appendTasks()
	if f := failedAppend(ts); f != "" {
		t.Fatalf("an append failed: %s", f)
	}
	for _, task := range ts {
		if task.State != "completed" || task.Retried != 0 {
			t.Fatalf("append %s: %s, retried %d; want completed without a retry", task.ID, task.State, task.Retried)
		}
	}
	if m, err := tokens.ReadManifest(filepath.Join(storesDir, "held")); err != nil || len(m.Shards) != 2 {
		t.Fatalf("the store once free: %+v, %v; want its 2 files", m, err)
	}
}
