package scheduler

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"
)

// A snapshot of more tasks than one page lists gives every task once, in
// the order the queues list them, each with its own progress record, read
// as a task's status alone reads it: a record with an escape in its text,
// a corrupt one (no progress), and none at all among them; and a task that
// `sched cancel` withdrew says so.
func TestASnapshotOfManyPagesGivesEachTaskItsOwnProgress(t *testing.T) {
	c, _ := newTestClient(t)
	ctx := context.Background()
	n := 2*snapshotPage + 7
	args := make([]Args, n)
	for i := range args {
		args[i] = IngestShard{Dataset: "d", Store: "s", Path: fmt.Sprintf("data/%05d.parquet", i), ShardID: fmt.Sprintf("d/%05d", i)}
	}
	if res, err := c.EnqueueMany(ctx, args, 8); err != nil || res.Enqueued != n {
		t.Fatalf("enqueue %d: %+v, %v", n, res, err)
	}
	ids := make([]string, n)
	for i, a := range args {
		id, err := TaskID(a)
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	const (
		escaped = 1    // its message has quotes: encoding/json reads it
		corrupt = 1000 // at the end of the first page
		none    = 1001 // the first of the second page
		gone    = 2002 // withdrawn by sched cancel
	)
	for i, id := range ids {
		if i == none {
			continue
		}
		p := Progress{TaskID: id, Kind: KindIngestShard, Fraction: -1, State: "waiting", Worker: "vm:1",
			Message: "waits for tokenizer t" + id, Started: at.Add(time.Duration(i) * time.Millisecond), Updated: at.Add(time.Duration(i) * time.Second)}
		if i == escaped {
			p.Message = `waits for "t" <1>`
		}
		if err := WriteProgress(ctx, c.rdb, p, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.rdb.Set(ctx, progressKey(ids[corrupt]), `{"task_id":`, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, ids[gone]); err != nil {
		t.Fatal(err)
	}

	s, err := c.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Tasks) != n {
		t.Fatalf("snapshot holds %d tasks; want %d", len(s.Tasks), n)
	}
	index := map[string]int{}
	for i, ts := range s.Tasks {
		if _, twice := index[ts.ID]; twice {
			t.Fatalf("task %s is in the snapshot twice", ts.ID)
		}
		index[ts.ID] = i
		if ts.State != "pending" && ts.ID != ids[gone] {
			t.Fatalf("task %s is %s; want pending", ts.ID, ts.State)
		}
	}
	// The pending are read again after the archived (a task queued while
	// the lists were read), and each task is taken as its last read found
	// it: the archived one comes first.
	if s.Tasks[0].ID != ids[gone] {
		t.Errorf("the first task listed is %s; want the archived %s, listed before the pending read again after it", s.Tasks[0].ID, ids[gone])
	}
	for i, id := range ids {
		j, ok := index[id]
		if !ok {
			t.Fatalf("task %d (%s) is not in the snapshot", i, id)
		}
		got := s.Tasks[j]
		switch i {
		case corrupt, none:
			if got.HasProgress || got.Progress != (Progress{}) {
				t.Errorf("task %d: progress %v %+v; want none", i, got.HasProgress, got.Progress)
			}
			continue
		case gone:
			if !got.Cancelled || got.State != "archived" {
				t.Errorf("withdrawn task: state %s, cancelled %v; want archived, cancelled", got.State, got.Cancelled)
			}
		}
		if !got.HasProgress || got.Progress.TaskID != id || !got.Progress.Updated.Equal(at.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("task %d (%s): progress %v %+v; want its own", i, id, got.HasProgress, got.Progress)
		}
		// As a task's status alone reads it, with encoding/json.
		if i%97 == 0 || i == escaped || i == gone {
			alone, err := c.Task(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Progress, alone.Progress) || got.HasProgress != alone.HasProgress || got.Cancelled != alone.Cancelled {
				t.Errorf("task %d: snapshot reads\n%+v\nthe task alone\n%+v", i, got, alone)
			}
		}
	}
}
