package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// Progress is what a running task last reported; workers write it to Redis
// and `sched status` reads it.
type Progress struct {
	TaskID string `json:"task_id"`
	Kind   string `json:"kind"`
	// Fraction done in [0,1]; negative when unknown.
	Fraction float64 `json:"fraction"`
	// Rate is work per second; Unit names the work: "tok", "B" (bytes),
	// "files", "tasks" (a "/s" suffix is accepted and means the same).
	Rate float64 `json:"rate,omitempty"`
	Unit string  `json:"unit,omitempty"`
	// ETA is the estimated time left; zero when unknown.
	ETA     time.Duration `json:"eta,omitempty"`
	Message string        `json:"message,omitempty"`
	// State is "running", "done", "failed", "interrupted", "waiting", or
	// "stopped": an ingest step that completed at its ingest's limit
	// (--max-tokens, --max-disk), leaving its file out of the store.
	State string `json:"state"`
	// Taken is, for an ingest:append stopped at its limit, the tokens of
	// its file it appended first: the part that fit.
	Taken   int64     `json:"taken,omitempty"`
	Worker  string    `json:"worker,omitempty"`
	Started time.Time `json:"started"`
	Updated time.Time `json:"updated"`
}

// progressKey is the Redis key of a task's progress; it lives as long as
// the task's retention so that `sched runs` can show the last message.
func progressKey(taskID string) string { return "kiln:progress:" + taskID }

// WriteProgress stores p, expiring after ttl.
func WriteProgress(ctx context.Context, rdb redis.UniversalClient, p Progress, ttl time.Duration) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	if err := rdb.Set(ctx, progressKey(p.TaskID), b, ttl).Err(); err != nil {
		return redismem.Wrap("write progress of "+p.TaskID, err)
	}
	return nil
}

// ReadProgress returns a task's last progress; ok is false when none was written.
func ReadProgress(ctx context.Context, rdb redis.UniversalClient, taskID string) (p Progress, ok bool, err error) {
	b, err := rdb.Get(ctx, progressKey(taskID)).Bytes()
	if errors.Is(err, redis.Nil) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("read progress of %s: %w", taskID, err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, false, fmt.Errorf("progress of %s is corrupt: %w", taskID, err)
	}
	return p, true, nil
}

// ReadProgressMany returns the progress records of ids that have one, in
// one MGET per thousand ids.
func ReadProgressMany(ctx context.Context, rdb redis.UniversalClient, ids []string) (map[string]Progress, error) {
	out := make(map[string]Progress, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), 1000)
		keys := make([]string, n)
		for i, id := range ids[:n] {
			keys[i] = progressKey(id)
		}
		vals, err := rdb.MGet(ctx, keys...).Result()
		if err != nil {
			return nil, fmt.Errorf("read progress: %w", err)
		}
		for i, v := range vals {
			s, ok := v.(string)
			if !ok {
				continue
			}
			var p Progress
			// A corrupt record is shown as no progress; the task itself is unaffected.
			if json.Unmarshal([]byte(s), &p) == nil {
				out[ids[i]] = p
			}
		}
		ids = ids[n:]
	}
	return out, nil
}

// cancelKey marks a task cancelled by `sched cancel`, so the worker archives
// it instead of retrying the handler's cancellation error.
func cancelKey(taskID string) string { return "kiln:cancel:" + taskID }

// forget deletes what kiln keeps of task id beside asynq's record, its
// cancel mark and its last report, once that record is deleted: a task
// queued again under the same id (the same work) is new, and would read as
// cancelled, or waiting for what it waited for before, and a worker would
// archive it for the old cancel.
func (c *Client) forget(ctx context.Context, id string) error {
	return c.rdb.Del(ctx, cancelKey(id), progressKey(id)).Err()
}

// IsCancelled reports whether `sched cancel` was run on taskID.
func IsCancelled(ctx context.Context, rdb redis.UniversalClient, taskID string) bool {
	n, err := rdb.Exists(ctx, cancelKey(taskID)).Result()
	return err == nil && n > 0
}

// markCancelled applies the value of a task's cancel mark (the Unix time
// of `sched cancel`, "" where none) to ts: Cancelled, and Finished where
// asynq has no time for it (a task archived before it ever ran).
func markCancelled(ts *TaskStatus, mark string) {
	if mark == "" {
		return
	}
	ts.Cancelled = true
	if at, err := strconv.ParseInt(mark, 10, 64); err == nil && ts.Finished.IsZero() {
		ts.Finished = time.Unix(at, 0)
	}
}
