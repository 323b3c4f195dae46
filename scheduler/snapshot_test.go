package scheduler

import (
	"testing"

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
