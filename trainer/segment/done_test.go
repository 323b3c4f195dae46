package segment

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/redismem"
	"github.com/kiln-lm/kiln/scheduler"
)

// Redis full (maxmemory reached, under noeviction) as the run's last
// segment records the run done: the segment returned success, its write
// refused, and the run read not done (`sched status`, kiln_run_done, a
// waiting `sched demo`) until someone queued another segment. The write is
// made again until Redis takes it, once it has room; and where the task
// stops first (its lease lapsed, a shutdown), the segment fails saying so,
// and its retry, which trains nothing, records the run done.
func TestARunsEndThatRedisRefusesIsRecordedOnceItHasRoom(t *testing.T) {
	for _, c := range []struct {
		name string
		// stops says the task stops while Redis is still full.
		stops bool
	}{{"Redis has room again", false}, {"the task stops first", true}} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			through, _, _ := faultyS3(t)
			rdb := newRedis(t)
			const name, total = "fullend", 4
			disk := t.TempDir()
			core, logs := observer.New(zap.InfoLevel)
			// The sample for the run's results is taken once its last
			// checkpoint is uploaded and recorded, and before its end is:
			// Redis is full from then on.
			var sampled atomic.Int32
			full := make(chan error, 1)
			sample := func(context.Context, string) ([]int32, string, error) {
				if sampled.Add(1) == 1 {
					full <- rdb.ConfigSet(context.Background(), "maxmemory", "1").Err()
				}
				return []int32{1, 2}, "func f() {}", nil
			}
			type result struct {
				out Outcome
				err error
			}
			ended := make(chan result, 1)
			go func() {
				out, err := Run(ctx, Params{Run: testRun(name, total), Dir: disk, Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a",
					Log: zap.New(core), Sample: sample})
				ended <- result{out, err}
			}()
			const waits = "Redis did not take the write that records it done"
			var r result
			returned := false
			waitFor(t, "the segment waiting for Redis to record the run's end, or ending", func() bool {
				select {
				case r = <-ended:
					returned = true
				default:
				}
				return returned || logs.FilterMessageSnippet(waits).Len() > 0
			})
			select {
			case err := <-full:
				if err != nil {
					t.Fatal(err)
				}
			default:
				t.Fatalf("the segment ended without taking the sample for its results: %+v, %v", r.out, r.err)
			}
			if returned {
				st, _, err := scheduler.ReadRunState(context.Background(), rdb, name)
				t.Fatalf("the segment ended with Redis full: %+v, %v; the run's state %+v, %v; want it to wait for Redis to record the run done", r.out, r.err, st, err)
			}
			l := logs.FilterMessageSnippet(waits).All()
			if why, _ := l[0].ContextMap()["redis"].(string); len(l) != 1 || !redismem.RefusedIn(why) || !strings.Contains(why, redismem.Remedy) {
				t.Errorf("the wait's warning: %+v; want it once, with Redis's refusal and what to do", l)
			}
			if c.stops {
				cancel()
				if r = <-ended; r.err == nil || !strings.Contains(r.err.Error(), "its state in Redis does not record it done") ||
					!strings.Contains(r.err.Error(), "its retry, which trains nothing, records it") {
					t.Fatalf("the segment stopped while Redis was full: %+v, %v; want an error that says the run's end is not recorded, and that the retry records it", r.out, r.err)
				}
			}
			if err := rdb.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if c.stops {
				// The retry, on the worker that ran it.
				r.out, r.err = Run(context.Background(), Params{Run: testRun(name, total), Dir: disk, Redis: rdb, Objects: through, OpenData: openStream,
					Owner: "gpu-a", Sample: sample})
				if r.err != nil || !r.out.Done || r.out.ResumedFrom != total {
					t.Fatalf("the retry: %+v, %v; want it to resume at the run's end and end it", r.out, r.err)
				}
			} else {
				if r = <-ended; r.err != nil || !r.out.Done || r.out.Step != total {
					t.Fatalf("the segment: %+v, %v; want the run done at step %d", r.out, r.err, total)
				}
				if l := logs.FilterMessageSnippet("the run's end recorded").All(); len(l) != 1 {
					t.Errorf("the end of the wait: %+v; want it said once", l)
				}
			}
			st, _, err := scheduler.ReadRunState(context.Background(), rdb, name)
			if err != nil || !st.Done || st.Step != total || st.Checkpoint != total || st.Phase != "" {
				t.Fatalf("the run's state: %+v, %v; want it done at step %d, its last checkpoint recorded, no phase", st, err, total)
			}
		})
	}
}
