package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// Live work is what is running, queued, scheduled or waiting out a retry:
// work that will still happen. A step that needs an earlier one (an ingest
// its tokenizer, a run its stores) asks these, at enqueue to accept it and
// on the worker to wait for it.

// liveLists are the inspector's lists of live tasks, in the order live
// reads them: the way tasks move (a retry or a scheduled task becomes
// pending when due, a pending one active), then the retries again, for an
// active task that failed in between: it waits out its back-off (seconds
// at least, for every kind) in retry, so it cannot be pending again before
// that last read. Then pending and active again, for a task queued by one
// that ended while they were read (a plan's shard, a segment's next): born
// pending after the first read of pending, with the one that queued it
// gone from active by the read of active, it was found at no read. A task
// that moves while the lists are read is found at a later read; one found
// twice counts once.
func (c *Client) liveLists() []liveList {
	return []liveList{
		{c.insp.ListRetryTasks, "retry"}, {c.insp.ListScheduledTasks, "scheduled"}, {c.insp.ListPendingTasks, "pending"},
		{c.insp.ListActiveTasks, "active"}, {c.insp.ListRetryTasks, "retry"},
		{c.insp.ListPendingTasks, "pending"}, {c.insp.ListActiveTasks, "active"},
	}
}

type liveList struct {
	list  func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	state string
}

// liveScanLimit bounds how long one reading of the lists may take: under
// the shortest back-off a failed task waits in retry (5 s less its jitter,
// the training segment's), so that a task that failed after the active
// list was read is still in retry at the last read. A slower reading (a
// machine or a Redis very busy) is made again.
const liveScanLimit = 2 * time.Second

// live counts queue's live tasks of the given kinds that match accepts, and
// returns one of them, a running one if there is one.
func (c *Client) live(ctx context.Context, queue string, kinds map[string]bool, match func(*asynq.TaskInfo) bool) (int, *asynq.TaskInfo, error) {
	known, err := c.knownQueues()
	if err != nil || !known[queue] {
		return 0, nil, err
	}
	for try := 1; ; try++ {
		start := time.Now()
		n, first, err := c.scanLive(ctx, queue, kinds, match)
		if err != nil || time.Since(start) < liveScanLimit || try == 5 {
			return n, first, err
		}
	}
}

// scanLive reads the live lists once, in liveLists' order.
func (c *Client) scanLive(ctx context.Context, queue string, kinds map[string]bool, match func(*asynq.TaskInfo) bool) (int, *asynq.TaskInfo, error) {
	const page = 1000
	seen := map[string]bool{}
	var first *asynq.TaskInfo
	firstActive := false
	for _, l := range c.liveLists() {
		for p := 1; ; p++ {
			if err := ctx.Err(); err != nil {
				return 0, nil, err
			}
			tasks, err := l.list(queue, asynq.Page(p), asynq.PageSize(page))
			if err != nil {
				return 0, nil, fmt.Errorf("list the %s queue: %w", queue, err)
			}
			for _, ti := range tasks {
				if !kinds[ti.Type] || !match(ti) {
					continue
				}
				seen[ti.ID] = true
				if active := l.state == "active"; first == nil || active && !firstActive {
					first, firstActive = ti, active
				}
			}
			if len(tasks) < page {
				break
			}
		}
		if c.listed != nil {
			c.listed(queue, l.state)
		}
	}
	return len(seen), first, nil
}

// LiveSegment is the task of run's training chain that is live, or nil: a
// run is one chain of segments, so a second first segment queued beside a
// live one would start a second chain.
func (c *Client) LiveSegment(ctx context.Context, run string) (*asynq.TaskInfo, error) {
	_, ti, err := c.live(ctx, QueueGPU, map[string]bool{KindTrainSegment: true}, func(ti *asynq.TaskInfo) bool {
		a, err := Decode[TrainSegment](ti.Payload)
		return err == nil && a.Run == run
	})
	return ti, err
}

// SupersedingSegment is a live segment of run, other than id, that the
// segment id, queued to resume from step from (its FromStep), leaves the
// run to, or nil: one queued to resume from a later step, or from the same
// step with a lower id (so that of two such, one trains). A segment queues
// the next before the queue records it done: where its worker stops
// answering in between (a SIGKILL, a power loss), asynq runs it again, and
// it would start a second chain of segments beside the one it queued,
// which a cancel of one would not stop.
func (c *Client) SupersedingSegment(ctx context.Context, run, id string, from int64) (*asynq.TaskInfo, error) {
	_, ti, err := c.live(ctx, QueueGPU, map[string]bool{KindTrainSegment: true}, func(ti *asynq.TaskInfo) bool {
		if ti.ID == id {
			return false
		}
		a, err := Decode[TrainSegment](ti.Payload)
		return err == nil && a.Run == run && (a.FromStep > from || a.FromStep == from && ti.ID < id)
	})
	return ti, err
}

// DropArchivedSegmentsFrom deletes run's archived segments that began at
// step from or later, and returns their ids: those of a done run are
// extensions past its end that failed or were cancelled, which sched
// status reads as what became of the run. Where the run is to stay done
// at its total (its runs entry put back), they are history no longer.
func (c *Client) DropArchivedSegmentsFrom(ctx context.Context, run string, from int64) ([]string, error) {
	const page = 1000
	var ids []string
	for p := 1; ; p++ {
		if err := ctx.Err(); err != nil {
			return ids, err
		}
		tasks, err := c.insp.ListArchivedTasks(QueueGPU, asynq.Page(p), asynq.PageSize(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return nil, nil // no task was ever queued on it
		}
		if err != nil {
			return ids, fmt.Errorf("list the %s queue's archived tasks: %w", QueueGPU, err)
		}
		for _, ti := range tasks {
			if ti.Type != KindTrainSegment {
				continue
			}
			if a, err := Decode[TrainSegment](ti.Payload); err == nil && a.Run == run && a.FromStep >= from {
				ids = append(ids, ti.ID)
			}
		}
		if len(tasks) < page {
			break
		}
	}
	for _, id := range ids {
		if err := c.insp.DeleteTask(QueueGPU, id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return ids, fmt.Errorf("delete the archived segment %s: %w", id, err)
		}
		// A segment queued later from the same step takes the same id: a
		// cancel mark left would cancel it.
		if err := c.forget(ctx, id); err != nil {
			return ids, fmt.Errorf("delete the archived segment %s: %w", id, err)
		}
	}
	return ids, nil
}

// LiveTokenizer is a live task that makes tokenizer name (its sampling or
// its training), or nil. The stages are read in the pipeline's order,
// sampling before training: the last sample queues the training before it
// completes, so work that was live at the first read is found at the
// second, wherever it has moved in between.
func (c *Client) LiveTokenizer(ctx context.Context, name string) (*asynq.TaskInfo, error) {
	_, ti, err := c.live(ctx, QueueIngest, map[string]bool{KindTokenizerSample: true}, func(ti *asynq.TaskInfo) bool {
		a, err := Decode[TokenizerSample](ti.Payload)
		return err == nil && a.Name == name
	})
	if ti != nil || err != nil {
		return ti, err
	}
	_, ti, err = c.live(ctx, QueueAppend, map[string]bool{KindTokenizerTrain: true}, func(ti *asynq.TaskInfo) bool {
		a, err := Decode[TokenizerTrain](ti.Payload)
		return err == nil && a.Name == name
	})
	return ti, err
}

// LiveIngest counts the live tasks that fill token store store: its plans,
// shards and appends, read in the pipeline's order (a task queues the next
// stage before it completes) so that no live work slips between the reads.
func (c *Client) LiveIngest(ctx context.Context, store string) (int, error) {
	n, _, err := c.live(ctx, QueueIngest, map[string]bool{KindIngestPlan: true, KindIngestShard: true}, func(ti *asynq.TaskInfo) bool {
		switch ti.Type {
		case KindIngestPlan:
			a, err := Decode[IngestPlan](ti.Payload)
			return err == nil && a.Store == store
		default:
			a, err := Decode[IngestShard](ti.Payload)
			return err == nil && a.Store == store
		}
	})
	if err != nil {
		return 0, err
	}
	m, _, err := c.live(ctx, QueueAppend, map[string]bool{KindIngestAppend: true}, func(ti *asynq.TaskInfo) bool {
		a, err := Decode[IngestAppend](ti.Payload)
		return err == nil && a.Store == store
	})
	return n + m, err
}

// FailedIngests reads, from one snapshot, the ingest of every store that
// lacks what no task will add unless it is queued again: files whose
// ingest failed for good or was cancelled (Failed), or whose latest plan
// did (PlanFailed). A failure is an archived task, so where the ingest queues hold
// none it reads no snapshot: every segment starts with this, and a
// snapshot reads every task Redis keeps, a week of a large ingest's
// completed ones (seconds, and hundreds of MB, at 100,000 of them).
func (c *Client) FailedIngests(ctx context.Context) (map[string]DatasetProgress, error) {
	known, err := c.shownQueues()
	if err != nil {
		return nil, err
	}
	archived := 0
	for _, q := range IngestQueues {
		if !known[q] {
			continue
		}
		info, err := c.insp.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("status of queue %s: %w", q, err)
		}
		archived += info.Archived
	}
	if archived == 0 {
		return map[string]DatasetProgress{}, nil
	}
	snap, err := c.SnapshotOf(ctx, IngestQueues...)
	if err != nil {
		return nil, err
	}
	out := map[string]DatasetProgress{}
	for _, d := range snap.Datasets() {
		if d.Failed > 0 || d.PlanFailed {
			out[d.Store] = d
		}
	}
	return out, nil
}
