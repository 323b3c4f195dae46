package scheduler

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// QueueStatus is one queue's sizes and its running tasks.
type QueueStatus struct {
	Name      string
	Size      int // pending + active + scheduled + retry
	Pending   int
	Active    int
	Scheduled int
	Retry     int
	Archived  int
	Completed int
	Paused    bool
	Running   []TaskStatus
}

// TaskStatus is a task with its last progress.
type TaskStatus struct {
	ID    string
	Kind  string
	Queue string
	State string
	// Payload is the task's raw payload, for display.
	Payload     []byte
	Progress    Progress
	HasProgress bool
	LastErr     string
	Retried     int
	// MaxRetry is the retries the task's kind allows after its first
	// attempt.
	MaxRetry int
	// Finished is when a completed task completed or an archived one was
	// archived (zero otherwise).
	Finished time.Time
	// LastFailed is when the task last failed (zero if never).
	LastFailed time.Time
	// NextRun is when a waiting task runs next (retry, scheduled).
	NextRun time.Time
	// Orphaned is asynq's word for an active task whose lease lapsed.
	Orphaned bool
	// Lost is set by Snapshot on an active task whose worker is gone, or
	// whose lease lapsed (Orphaned).
	Lost bool
	// WorkerLive is set by Snapshot where the worker process the task's
	// progress names still heartbeats: a lost task's lease lapsed under a
	// live worker (a Redis outage longer than the lease).
	WorkerLive bool
	// Cancelled is an archived task stopped by `sched cancel` (its
	// cancel mark); set by Snapshot, Runs and Task. Snapshot sets it on a
	// running task that `sched cancel` asked to stop too.
	Cancelled bool
}

// Ended reports whether the task has ended: completed, or archived (failed
// for good, or cancelled); nothing more runs of it until it is queued again.
func (t TaskStatus) Ended() bool { return t.State == "completed" || t.State == "archived" }

// Status returns every kiln queue with its running tasks' progress. A queue
// no task has reached yet is reported empty.
func (c *Client) Status(ctx context.Context) ([]QueueStatus, error) {
	known, err := c.shownQueues()
	if err != nil {
		return nil, err
	}
	var out []QueueStatus
	for _, q := range Queues {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		qs := QueueStatus{Name: q}
		if !known[q] {
			out = append(out, qs)
			continue
		}
		info, err := c.insp.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("status of queue %s: %w", q, err)
		}
		qs.Pending, qs.Active, qs.Scheduled = info.Pending, info.Active, info.Scheduled
		qs.Retry, qs.Archived, qs.Completed, qs.Paused = info.Retry, info.Archived, info.Completed, info.Paused
		// asynq counts finished tasks in its size; kiln means the work waiting or running.
		qs.Size = qs.Pending + qs.Active + qs.Scheduled + qs.Retry
		active, err := c.insp.ListActiveTasks(q, asynq.PageSize(100))
		if err != nil {
			return nil, fmt.Errorf("active tasks of queue %s: %w", q, err)
		}
		for _, ti := range active {
			qs.Running = append(qs.Running, c.taskStatus(ctx, ti))
		}
		out = append(out, qs)
	}
	return out, nil
}

// knownQueues returns the queues asynq has seen a task in; asking about
// another is an error in asynq, while to kiln it is just an empty queue.
//
// asynq adds a queue to its set (asynqQueues) at a process's first task
// there, and only then: a worker that queued appends before Redis lost its
// data queues more after it without adding the queue again, and its tasks
// would be there, unseen by status, cancel, retry and the waits for an
// ingest. Kiln's own queues are added back where they are missing.
func (c *Client) knownQueues() (map[string]bool, error) {
	m, missing, err := c.queuesInSet()
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		if err := c.rdb.SAdd(context.Background(), asynqQueues, missing...).Err(); err != nil {
			return nil, fmt.Errorf("list queues: %w", err)
		}
		for _, q := range missing {
			m[q.(string)] = true
		}
	}
	return m, nil
}

// shownQueues is knownQueues for the listings (status, runs), which a
// Redis full before kiln added its queues (a fresh or shared one) must not
// end: the queues' adding is a write it refuses, and the listing reads
// what Redis holds all the same, the queues missing empty, while its
// snapshot says Redis is full (Snapshot.RedisFull). The waits for earlier
// work keep knownQueues: a queue taken for empty there would let a task
// go on before the work it waits for.
func (c *Client) shownQueues() (map[string]bool, error) {
	m, err := c.knownQueues()
	if redismem.Refused(err) {
		m, _, err = c.queuesInSet()
	}
	return m, err
}

// queuesInSet returns the queues asynq's set holds, and kiln's queues it
// lacks.
func (c *Client) queuesInSet() (map[string]bool, []any, error) {
	qs, err := c.insp.Queues()
	if err != nil {
		return nil, nil, fmt.Errorf("list queues: %w", err)
	}
	m := make(map[string]bool, len(qs))
	for _, q := range qs {
		m[q] = true
	}
	var missing []any
	for _, q := range Queues {
		if !m[q] {
			missing = append(missing, q)
		}
	}
	return m, missing, nil
}

// asynqQueues is the Redis set in which asynq (v0.26) keeps the names of
// its queues.
const asynqQueues = "asynq:queues"

func newTaskStatus(ti *asynq.TaskInfo) TaskStatus {
	ts := TaskStatus{
		ID: ti.ID, Kind: ti.Type, Queue: ti.Queue, State: ti.State.String(),
		Payload: ti.Payload, LastErr: ti.LastErr, Retried: ti.Retried, MaxRetry: Retries(ti.Type, ti.MaxRetry),
		LastFailed: ti.LastFailedAt, NextRun: ti.NextProcessAt, Orphaned: ti.IsOrphaned,
	}
	switch ti.State {
	case asynq.TaskStateCompleted:
		ts.Finished = ti.CompletedAt
	case asynq.TaskStateArchived:
		ts.Finished = ti.LastFailedAt
	}
	return ts
}

func (c *Client) taskStatus(ctx context.Context, ti *asynq.TaskInfo) TaskStatus {
	return c.statusOf(ctx, newTaskStatus(ti))
}

// statusOf is ts with its progress report and, archived, its cancel mark.
func (c *Client) statusOf(ctx context.Context, ts TaskStatus) TaskStatus {
	if p, ok, err := ReadProgress(ctx, c.rdb, ts.ID); err == nil && ok {
		ts.Progress, ts.HasProgress = p, true
	}
	if ts.State == asynq.TaskStateArchived.String() {
		mark, _ := c.rdb.Get(ctx, cancelKey(ts.ID)).Result()
		markCancelled(&ts, mark)
	}
	return ts
}

// Task returns one task's status by id.
func (c *Client) Task(ctx context.Context, id string) (TaskStatus, error) {
	ti, err := c.Find(ctx, id)
	if err != nil {
		return TaskStatus{}, err
	}
	return c.taskStatus(ctx, ti), nil
}

// Runs returns finished tasks (completed, and archived: failed for good or
// cancelled) kept by retention, newest first, at most limit of them. asynq
// lists them oldest first, so every page is read; a task archived without
// a failure (cancelled before it ran) has no finishing time and comes last.
func (c *Client) Runs(ctx context.Context, limit int) ([]TaskStatus, error) {
	known, err := c.shownQueues()
	if err != nil {
		return nil, err
	}
	var finished []TaskStatus
	for _, q := range Queues {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !known[q] {
			continue
		}
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){c.insp.ListCompletedTasks, c.insp.ListArchivedTasks} {
			tis, err := allPages(list, q)
			if err != nil {
				return nil, fmt.Errorf("finished %w", err)
			}
			for _, ti := range tis {
				finished = append(finished, newTaskStatus(ti))
			}
		}
	}
	sort.Slice(finished, func(i, j int) bool { return finished[i].Finished.After(finished[j].Finished) })
	finished = finished[:min(len(finished), limit)]
	// Progress and cancel marks only for the tasks returned: each is a
	// read of Redis, and a large ingest keeps thousands.
	out := make([]TaskStatus, len(finished))
	for i, ts := range finished {
		out[i] = c.statusOf(ctx, ts)
	}
	return out, nil
}
