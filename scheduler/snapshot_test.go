package scheduler

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// A worker runs the RUNNING tasks that are its, whatever its last
// heartbeat (every 5s) listed: a task just started is counted before the
// heartbeat lists it, and one just finished is not counted after.
func TestAWorkerRunsTheRunningTasksThatAreItsOwn(t *testing.T) {
	servers := []*asynq.ServerInfo{
		{Host: "vm", PID: 1, Queues: map[string]int{QueueGPU: 1}, Concurrency: 1,
			ActiveWorkers: []*asynq.WorkerInfo{{TaskID: "finished"}, {TaskID: "no-progress-yet"}}},
		{Host: "vm", PID: 2, Queues: map[string]int{QueueIngest: 4}, Concurrency: 4},
	}
	s := &Snapshot{Tasks: []TaskStatus{
		{ID: "started", State: "active", HasProgress: true, Progress: Progress{Worker: "vm:1"}},
		{ID: "no-progress-yet", State: "active"},
		{ID: "finished", State: "completed", HasProgress: true, Progress: Progress{Worker: "vm:1"}},
		{ID: "ingest", State: "active", HasProgress: true, Progress: Progress{Worker: "vm:2"}},
		{ID: "pending", State: "pending"},
	}}
	s.Workers = workerProcesses(servers)
	s.countActive(servers)
	got := map[string]int{}
	for _, w := range s.Workers {
		got[w.Name] = w.Active
	}
	if got["vm:1"] != 2 || got["vm:2"] != 1 || len(got) != 2 {
		t.Fatalf("running per worker %v; want vm:1 2 (started, no-progress-yet), vm:2 1", got)
	}
}

// A running task is lost when its worker stops heartbeating, or when its
// lease lapsed (asynq's orphaned) under a worker that heartbeats still: a
// Redis outage longer than the lease. The second says its worker lives.
func TestALostTaskSaysWhetherItsWorkerLives(t *testing.T) {
	servers := []*asynq.ServerInfo{{Host: "vm", PID: 1, Queues: map[string]int{QueueGPU: 1}, Concurrency: 1}}
	s := &Snapshot{Tasks: []TaskStatus{
		{ID: "lapsed", State: "active", Orphaned: true, HasProgress: true, Progress: Progress{Worker: "vm:1"}},
		{ID: "dead", State: "active", HasProgress: true, Progress: Progress{Worker: "vm:9"}},
		{ID: "running", State: "active", HasProgress: true, Progress: Progress{Worker: "vm:1"}},
	}}
	s.markLost(servers)
	for i, want := range []struct{ lost, live bool }{{true, true}, {true, false}, {false, true}} {
		if got := s.Tasks[i]; got.Lost != want.lost || got.WorkerLive != want.live {
			t.Errorf("%s: lost %v, worker live %v; want %v, %v", got.ID, got.Lost, got.WorkerLive, want.lost, want.live)
		}
	}
}

// A segment is listed by the step it was queued at: a retry after a crash
// resumes from the run's newest checkpoint, past it, so "from step 0" read
// as where a segment at step 4400 had started.
func TestASegmentIsListedByTheStepItWasQueuedAt(t *testing.T) {
	b, err := Encode(TrainSegment{Run: "r2", FromStep: 400})
	if err != nil {
		t.Fatal(err)
	}
	if got := Subject(KindTrainSegment, b); got != "run r2 queued at step 400" {
		t.Errorf("Subject of a segment queued at step 400: %q", got)
	}
}

// A file an ingest appended whole is done, whatever a later ingest of a
// smaller limit said of it: that ingest's shard, planned before the append
// filled the store, found the store at its limit and left the file unread
// (stopped). The store was listed as stopped with the file left out.
func TestAFileAppendedWholeIsDoneWhateverALaterShardOfItSaid(t *testing.T) {
	enc := func(a Args) []byte {
		b, err := Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	shard := enc(IngestShard{Dataset: "code", Store: "c", ShardID: "f1", Path: "data/f1.parquet", Size: 100})
	apnd := enc(IngestAppend{Store: "c", ShardID: "f1", Tokens: 1000})
	s := &Snapshot{At: at.Add(time.Minute), Tasks: []TaskStatus{
		// The unlimited ingest's shard and append: the file is in whole.
		{ID: "s1", Kind: KindIngestShard, State: "completed", Payload: shard, Finished: at, HasProgress: true, Progress: Progress{State: "done", Updated: at}},
		{ID: "a1", Kind: KindIngestAppend, State: "completed", Payload: apnd, Finished: at.Add(time.Second), HasProgress: true, Progress: Progress{State: "done", Updated: at.Add(time.Second)}},
		// The smaller limit's shard, after it: the store was full.
		{ID: "s2", Kind: KindIngestShard, State: "completed", Payload: shard, Finished: at.Add(2 * time.Second), HasProgress: true,
			Progress: Progress{State: "stopped", Updated: at.Add(2 * time.Second), Message: "store c is full at --max-tokens 10: data/f1.parquet was not read"}},
	}}
	ds := s.Datasets()
	if len(ds) != 1 || ds[0].Done != 1 || ds[0].Stopped != 0 || ds[0].Tokens != 1000 {
		t.Fatalf("datasets %+v; want store c's one file done, 1000 tokens, none stopped", ds)
	}
}

// olderEnvelope is a's payload as a kiln that wrote its kind's previous
// payload version queued it.
func olderEnvelope(t *testing.T, a Args) []byte {
	t.Helper()
	p, _ := PolicyFor(a.Kind())
	raw, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(envelope{V: p.Version - 1, Args: raw})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A file that an append put in the store is done whatever a later append
// of it said: kiln upgraded mid-ingest refused the older kiln's append,
// the ingest enqueued again appended the file, and a 'sched retry' of the
// refused task, archived again at once, made the INGEST line read "1
// failed" for the tasks' 7 days, which no ingest enqueued again cleared.
// Its time in the store is the append's, so a store deleted from the disk
// after it still reads deleted.
func TestAFileAppendedIsDoneWhateverALaterAppendOfItSaid(t *testing.T) {
	at := time.Date(2026, 12, 8, 12, 0, 0, 0, time.UTC)
	ts := func(id, kind, st string, payload []byte, end time.Duration, lastErr string) TaskStatus {
		return TaskStatus{ID: id, Kind: kind, State: st, Payload: payload, Finished: at.Add(end).Truncate(time.Second), LastErr: lastErr,
			HasProgress: true, Progress: Progress{State: map[string]string{"completed": "done", "archived": "failed"}[st], Started: at, Updated: at.Add(end)}}
	}
	p, _ := PolicyFor(KindIngestAppend)
	refused := (&PayloadError{KindIngestAppend, versionMsg(p.Version-1, p.Version)}).Error()
	shard := IngestShard{Dataset: "code", Store: "c", ShardID: "f1", Path: "data/f1.parquet", Size: 100}
	apnd := IngestAppend{Store: "c", ShardID: "f1", Tokens: 1000}
	s := &Snapshot{At: at.Add(time.Minute), Tasks: []TaskStatus{
		// The older kiln's shard, and its append that the upgraded
		// worker refused.
		ts("s-old", KindIngestShard, "completed", olderEnvelope(t, shard), 100*time.Millisecond, ""),
		// The ingest enqueued again, at this build's version: the file
		// is in the store.
		ts("s-new", KindIngestShard, "completed", mustEncode(t, shard), 300*time.Millisecond, ""),
		ts("a-new", KindIngestAppend, "completed", mustEncode(t, apnd), 400*time.Millisecond, ""),
		// 'sched retry' of the refused append, refused again after.
		ts("a-old", KindIngestAppend, "archived", olderEnvelope(t, apnd), 500*time.Millisecond, refused),
	}}
	ds := s.Datasets()
	if len(ds) != 1 || ds[0].Files != 1 || ds[0].Done != 1 || ds[0].Failed != 0 || ds[0].FailedOlder != 0 || ds[0].Tokens != 1000 {
		t.Fatalf("datasets %+v; want store c's one file done, 1000 tokens, none failed", ds)
	}
	if want := at.Add(400 * time.Millisecond); !ds[0].Last.Equal(want) {
		t.Errorf("store c's last file done at %v; want %v, when its append completed, not when the refused one ended", ds[0].Last, want)
	}
}

// A file an older kiln's archived task left out of the store is told
// apart from one whose task failed at this build's version: 'sched retry'
// queues the older payload again, which this build refuses again. A plan
// that failed counts only while it is the store's latest: the ingest
// enqueued again plans anew.
func TestAFailureOfAnOlderKilnsTaskIsToldApart(t *testing.T) {
	at := time.Date(2026, 12, 8, 12, 0, 0, 0, time.UTC)
	ts := func(id, kind, st string, payload []byte, end time.Duration) TaskStatus {
		return TaskStatus{ID: id, Kind: kind, State: st, Payload: payload, Finished: at.Add(end).Truncate(time.Second),
			HasProgress: true, Progress: Progress{Started: at, Updated: at.Add(end)}}
	}
	plan := IngestPlan{Dataset: "code", Store: "c"}
	s := &Snapshot{At: at.Add(time.Minute), Tasks: []TaskStatus{
		// Store c: the older kiln's plan, refused, then the ingest
		// enqueued again.
		ts("p-old", KindIngestPlan, "archived", olderEnvelope(t, plan), 100*time.Millisecond),
		ts("p-new", KindIngestPlan, "completed", mustEncode(t, plan), 200*time.Millisecond),
		// f1's append, the older kiln's, refused; f2's failed at this
		// build's version.
		ts("a1", KindIngestAppend, "archived", olderEnvelope(t, IngestAppend{Store: "c", ShardID: "f1"}), 300*time.Millisecond),
		ts("a2", KindIngestAppend, "archived", mustEncode(t, IngestAppend{Store: "c", ShardID: "f2"}), 300*time.Millisecond),
		// Store d: only the older kiln's plan, refused.
		ts("p-d", KindIngestPlan, "archived", olderEnvelope(t, IngestPlan{Dataset: "web", Store: "d"}), 100*time.Millisecond),
	}}
	ds := s.Datasets()
	if len(ds) != 2 {
		t.Fatalf("datasets %+v; want stores c and d", ds)
	}
	if c := ds[0]; c.Store != "c" || c.Failed != 2 || c.FailedOlder != 1 || c.PlanFailed || c.PlanOlder {
		t.Errorf("store c: %+v; want 2 files failed, 1 of them an older kiln's, and no plan failed (the latest completed)", c)
	}
	if d := ds[1]; d.Store != "d" || !d.PlanFailed || !d.PlanOlder {
		t.Errorf("store d: %+v; want its plan failed, an older kiln's", d)
	}
}

func mustEncode(t *testing.T, a Args) []byte {
	t.Helper()
	b, err := Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// An ingest task names the token store it fills where that is not the
// one named after its dataset: FAILURES told two stores of one dataset
// apart by nothing.
func TestAnIngestTasksSubjectNamesItsStore(t *testing.T) {
	for _, c := range []struct {
		a    Args
		kind string
		want string
	}{
		{IngestShard{Dataset: "code", Store: "c15", Path: "data/a.parquet"}, KindIngestShard, "code data/a.parquet into c15"},
		{IngestShard{Dataset: "org/code", Store: "code", Path: "data/a.parquet"}, KindIngestShard, "org/code data/a.parquet"},
		{IngestPlan{Dataset: "code", Store: "c16"}, KindIngestPlan, "plan code into c16"},
		{IngestPlan{Dataset: "code"}, KindIngestPlan, "plan code"},
	} {
		b, err := Encode(c.a)
		if err != nil {
			t.Fatal(err)
		}
		if got := Subject(c.kind, b); got != c.want {
			t.Errorf("Subject(%s, %+v) = %q; want %q", c.kind, c.a, got, c.want)
		}
	}
}

// A file whose task is held by a lost worker counts as lost, not running,
// and the store has no ETA while nothing runs: it showed its files running
// and an ETA for the minutes until the tasks were recovered.
func TestAFileOfALostWorkerIsNotRunning(t *testing.T) {
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	var tasks []TaskStatus
	for i, st := range []string{"completed", "active", "active"} {
		b, err := Encode(IngestShard{Dataset: "code", Store: "code", ShardID: fmt.Sprint(i), Path: fmt.Sprint(i), Size: 100})
		if err != nil {
			t.Fatal(err)
		}
		tasks = append(tasks, TaskStatus{ID: fmt.Sprint("s", i), Kind: KindIngestShard, State: st, Payload: b, Lost: st == "active",
			HasProgress: true, Progress: Progress{Started: at, Updated: at.Add(time.Duration(i) * time.Second)}})
	}
	b, err := Encode(IngestAppend{Store: "code", ShardID: "0"})
	if err != nil {
		t.Fatal(err)
	}
	tasks = append(tasks, TaskStatus{ID: "a0", Kind: KindIngestAppend, State: "completed", Payload: b, HasProgress: true, Progress: Progress{State: "done", Updated: at.Add(time.Second)}})
	ds := (&Snapshot{At: at.Add(time.Minute), Tasks: tasks}).Datasets()
	if len(ds) != 1 || ds[0].Done != 1 || ds[0].Lost != 2 || ds[0].Running != 0 || ds[0].ETA != 0 {
		t.Fatalf("datasets %+v; want 1 file done, 2 on a lost worker, none running, no ETA", ds)
	}
}

// A file whose task failed an attempt and waits for its retry counts as
// retrying, not waiting: the INGEST line read "2 waiting" of appends
// failing on a full disk, their retries running out, as of files waiting
// their turn. One set back to wait out an outage (no retry used) waits.
func TestAFileRetryingAfterAFailureIsNotWaiting(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	var tasks []TaskStatus
	for i, p := range []string{"failed", "waiting", ""} {
		b, err := Encode(IngestAppend{Store: "code", ShardID: fmt.Sprint(i)})
		if err != nil {
			t.Fatal(err)
		}
		st := "retry"
		if p == "" {
			st = "pending"
		}
		tasks = append(tasks, TaskStatus{ID: fmt.Sprint("a", i), Kind: KindIngestAppend, State: st, Payload: b, HasProgress: p != "",
			Progress: Progress{State: p, Started: at, Updated: at}})
	}
	ds := (&Snapshot{At: at.Add(time.Minute), Tasks: tasks}).Datasets()
	if len(ds) != 1 || ds[0].Files != 3 || ds[0].Retrying != 1 || ds[0].Waiting != 2 || ds[0].Remaining() != 3 {
		t.Fatalf("datasets %+v; want 3 files: 1 retrying after its failure, 2 waiting, 3 remaining", ds)
	}
}

// A store that two datasets' ingests filled (--store naming one store for
// both) names both, whichever of their tasks Redis lists first: its line
// named the first dataset met and counted the other's files under it.
func TestAStoreFilledByTwoDatasetsNamesBoth(t *testing.T) {
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	var tasks []TaskStatus
	for i, a := range []Args{
		IngestPlan{Dataset: "the-stack-v2", Store: "code"},
		IngestShard{Dataset: "the-stack-v2", Store: "code", ShardID: "s0", Path: "a.parquet", Size: 100},
		IngestPlan{Dataset: "local:/src/*.go", Store: "code"},
		IngestShard{Dataset: "local:/src/*.go", Store: "code", ShardID: "l0", Path: "/src/main.go", Size: 10},
		IngestPlan{Dataset: "the-stack-v2", Store: "code"},
	} {
		b, err := Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		kind := KindIngestShard
		if _, plan := a.(IngestPlan); plan {
			kind = KindIngestPlan
		}
		tasks = append(tasks, TaskStatus{ID: fmt.Sprint("t", i), Kind: kind, State: "completed", Payload: b, Finished: at})
	}
	for _, order := range [][]TaskStatus{tasks, {tasks[3], tasks[2], tasks[1], tasks[0], tasks[4]}} {
		ds := (&Snapshot{At: at, Tasks: order}).Datasets()
		if len(ds) != 1 || len(ds[0].Datasets) != 2 || ds[0].Datasets[0] != "local:/src/*.go" || ds[0].Datasets[1] != "the-stack-v2" || ds[0].Files != 2 {
			t.Fatalf("datasets %+v; want store code of 2 files, of local:/src/*.go and the-stack-v2", ds)
		}
	}
}
