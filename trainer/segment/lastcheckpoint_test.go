package segment

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
)

// killedSegmentEnv makes TestHelperKilledSegment train a segment: the
// variable holds the run's name and total steps, the worker's directory,
// Redis's address, and the S3 endpoint, access key and secret key, one a
// line.
const killedSegmentEnv = "KILN_TEST_KILLED_SEGMENT"

// TestHelperKilledSegment is a worker's segment for
// TestARunKilledAsItsLastCheckpointIsMarkedEndsRecordingItAndRetentionRuns:
// it prints "training" and trains the run to its end, until it is killed.
func TestHelperKilledSegment(t *testing.T) {
	args := strings.Split(os.Getenv(killedSegmentEnv), "\n")
	if len(args) != 7 {
		t.Skip("a helper process of TestARunKilledAsItsLastCheckpointIsMarkedEndsRecordingItAndRetentionRuns")
	}
	total, err := strconv.Atoi(args[1])
	if err != nil {
		t.Fatal(err)
	}
	obj, err := store.NewS3(store.S3Options{Endpoint: args[4], Bucket: "kiln", AccessKey: args[5], SecretKey: args[6]})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: args[3]})
	defer rdb.Close()
	os.Stdout.WriteString("training\n")
	// A lease of a second: the next segment takes the run a second after
	// the kill, where it waited half a minute.
	out, err := Run(context.Background(), Params{Run: testRun(args[0], total), Dir: args[2], Redis: rdb, Objects: obj, OpenData: openStream,
		Owner: "gpu-a", LockTTL: time.Second,
		Progress: func(step, total int, m *trainer.Metrics) {
			// Each checkpoint (every 2 steps) is in object storage before
			// the step after the next: none takes the place of one
			// waiting to upload, and retention has run for each before
			// the last, whatever the machine's speed.
			if m == nil && step%2 == 1 && step > 1 {
				waitFor(t, fmt.Sprintf("step %d in object storage", step-1), func() bool {
					steps, err := RemoteSteps(context.Background(), obj, args[0])
					return err == nil && slices.Contains(steps, step-1)
				})
			}
		}})
	t.Fatalf("the segment ended before it was killed: %+v, %v", out, err)
}

// A worker killed once its run's last checkpoint is marked complete in
// object storage and before the run's state records it (SIGKILL, power
// loss: the window of one request's answer) leaves the state at the
// checkpoint before, and retention not run for the last one. The segment
// that takes the run over resumes from the last checkpoint on the disk
// and trains no step: it records that checkpoint in the run's state,
// where `sched status` and kiln_run_checkpoint_step named the one before
// for good, and runs retention for it, where one checkpoint more than it
// keeps stayed in object storage for good. So it does for a worker killed
// after the state write and before retention.
func TestARunKilledAsItsLastCheckpointIsMarkedEndsRecordingItAndRetentionRuns(t *testing.T) {
	for _, c := range []struct {
		name string
		// recorded says the kill came after the state write.
		recorded bool
	}{{"before the state write", false}, {"before retention", true}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			srv := testsvc.S3(t)
			faults := srv.Faults(t)
			obj, err := newS3Store(srv)
			if err != nil {
				t.Fatal(err)
			}
			rdb := newRedis(t)
			const run, total = "lastmark", 8
			disk := t.TempDir()
			marker := checkpointKey(run, total) + MarkerFile
			held := faults.Add(testsvc.Fault{Method: "PUT", Path: marker, Action: testsvc.HoldAnswer, Count: 1})
			worker := testsvc.StartChild(t, "TestHelperKilledSegment", killedSegmentEnv+"="+strings.Join([]string{
				run, strconv.Itoa(total), disk, rdb.Options().Addr, faults.Endpoint, srv.AccessKey, srv.SecretKey}, "\n"))
			<-held.Held
			worker.Kill(t)

			// What the kill left: the last checkpoint complete in object
			// storage, retention not run for it, the state at an older one.
			if steps, err := RemoteSteps(ctx, obj, run); err != nil || !slices.Equal(steps, []int{4, 6, total}) {
				t.Fatalf("checkpoints in object storage at the kill: %v, %v; want [4 6 %d]: the two retention kept, and the last", steps, err, total)
			}
			st, _, err := scheduler.ReadRunState(ctx, rdb, run)
			if err != nil || st.Checkpoint != 6 || st.Done {
				t.Fatalf("the run's state at the kill: %+v, %v; want checkpoint 6, not done", st, err)
			}
			if c.recorded {
				if err := rdb.HSet(ctx, scheduler.RunStateKey(run), "checkpoint", total).Err(); err != nil {
					t.Fatal(err)
				}
			}
			info, err := obj.Stat(ctx, marker)
			if err != nil {
				t.Fatal(err)
			}

			out, err := Run(ctx, Params{Run: testRun(run, total), Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
			if err != nil || !out.Done || out.ResumeSource != "local" || out.ResumedFrom != total {
				t.Fatalf("the segment after the kill: %+v, %v; want it to resume from the local step %d and end the run", out, err, total)
			}
			st, _, err = scheduler.ReadRunState(ctx, rdb, run)
			if err != nil || st.Checkpoint != total || !st.Done {
				t.Fatalf("the run's state: %+v, %v; want checkpoint %d, done", st, err, total)
			}
			if !c.recorded && !st.CheckpointAt.Equal(info.Modified.Truncate(time.Second)) {
				t.Errorf("the run's state says its last checkpoint was marked complete at %v; its marker was stored at %v", st.CheckpointAt, info.Modified)
			}
			if line := st.String(); !strings.Contains(line, fmt.Sprintf("last checkpoint step %d", total)) {
				t.Errorf("status line %q; want it to name the last checkpoint, step %d", line, total)
			}
			if steps, err := RemoteSteps(ctx, obj, run); err != nil || !slices.Equal(steps, []int{6, total}) {
				t.Errorf("checkpoints in object storage: %v, %v; want [6 %d], the newest two (keep_last 2)", steps, err, total)
			}
		})
	}
}
