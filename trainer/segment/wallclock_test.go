package segment

import (
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

// After Redis lost its data, the run's wall-clock goes on from the one the
// checkpoint resumed from recorded, whether it is on this disk or pulled
// from object storage, where it restarted from the segment after the loss
// (`sched results` said 15s of a run that trained for a minute). The first
// segment's part is an hour longer than it took, as a run's segments are,
// so that a sum that restarted reads far short of it.
func TestTheWallClockAfterRedisLostItsDataGoesOnFromTheCheckpoint(t *testing.T) {
	for _, c := range []struct {
		name, source string
	}{
		{"resumed from this disk", "local"},
		{"resumed from object storage", "object storage"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			rdb := newRedis(t)
			obj, _ := newS3(t)
			run := testRun("wall", 8)
			run.Segment.MaxSteps = 4
			disk := t.TempDir()
			first, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream,
				since: func(began time.Time) time.Duration { return time.Hour + time.Since(began) }})
			if err != nil || first.Uploaded != 4 || first.Done {
				t.Fatalf("first segment: %+v, %v", first, err)
			}
			st, err := trainer.CheckCheckpoint(filepath.Join(RunDir(disk, "wall"), trainer.StepDir(4)))
			if err != nil {
				t.Fatal(err)
			}
			recorded := st.Wall()
			if recorded < time.Hour || recorded > first.Wall {
				t.Fatalf("the checkpoint of step 4 records a wall-clock of %v; want the run's up to it, at least an hour and at most the %v of the segment's end", recorded, first.Wall)
			}

			if err := rdb.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if c.source == "object storage" {
				disk = t.TempDir() // the run moved to a worker of another disk
			}
			var stepped time.Time // once the second segment trained its first step
			second, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream,
				Progress: func(step, _ int, m *trainer.Metrics) {
					if step == 5 && m == nil && stepped.IsZero() {
						stepped = time.Now()
					}
				}})
			if err != nil || !second.Done || second.ResumedFrom != 4 || second.ResumeSource != c.source || stepped.IsZero() {
				t.Fatalf("second segment: %+v, %v; want the run done, resumed from step 4 (%s)", second, err, c.source)
			}
			// The second segment's part is at least the time to its first step.
			least := recorded + stepped.Sub(second.Began)
			if second.Wall < least {
				t.Errorf("the run's wall-clock after Redis lost its data is %v; want at least %v, the %v its checkpoint recorded and the second segment's", second.Wall, least, recorded)
			}
			state, known, err := scheduler.ReadRunState(ctx, rdb, "wall")
			if err != nil || !known || state.Wall < least {
				t.Errorf("the run's state records a wall-clock of %v (known %v, %v); want at least %v", state.Wall, known, err, least)
			}
			// What `sched results` prints, to the second.
			summary := readObject(t, ctx, obj, ResultsPrefix("wall")+results.SummaryFile)
			row := regexp.MustCompile(`\|\s*wall-clock\s*\|\s*(\S+)\s*\|`).FindSubmatch(summary)
			if row == nil {
				t.Fatalf("%s has no wall-clock row:\n%s", results.SummaryFile, summary)
			}
			if shown, err := time.ParseDuration(string(row[1])); err != nil || shown < recorded.Truncate(time.Second) {
				t.Errorf("%s says a wall-clock of %s (%v); want at least the %v the checkpoint before Redis lost its data recorded", results.SummaryFile, row[1], err, recorded.Truncate(time.Second))
			}
		})
	}
}
