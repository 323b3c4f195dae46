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
