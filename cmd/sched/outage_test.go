package main

import (
	"context"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// A run trains on through an outage of its object store, from one
// segment to the next: a segment that starts while the store is down
// resumes from the checkpoint on its disk, which is as new as any the
// store holds. The last segment, whose final checkpoint is the run's
// result, waits for the store, using up none of its retries; `sched
// status` says what it waits for. Once the store answers, the run is done
// and its checkpoints are there.
func TestARunTrainsThroughAnObjectStoreOutage(t *testing.T) {
	t.Parallel()
	o := startOutageRun(t)
	ctx := context.Background()
	// The store goes down while the first segment trains: that segment
	// ends on its local checkpoint, and the next one starts without it.
	o.s3.Stop()
	// The next segment starts without the store and trains to the end.
	o.waitStep(t, "run outage trained to step 40 while the store is down", 40)

	waiting := func() (scheduler.TaskStatus, bool) {
		snap, err := o.q.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range snap.Tasks {
			a, err := scheduler.DecodeTask[scheduler.TrainSegment](ts.Payload)
			if ts.Kind == scheduler.KindTrainSegment && err == nil && a.FromStep > 0 && ts.HasProgress && ts.Progress.State == "waiting" {
				return ts, true
			}
		}
		return scheduler.TaskStatus{}, false
	}
	var ts scheduler.TaskStatus
	waitUntil(t, "the last segment waiting for the object store", func() bool {
		var ok bool
		ts, ok = waiting()
		return ok
	})
	if !strings.Contains(ts.Progress.Message, "waiting for the object store at http://"+o.s3.Endpoint+"/kiln to answer (") || !strings.Contains(ts.Progress.Message, "connect: connection refused)") {
		t.Errorf("the waiting segment's message %q does not say it waits for the object store at %s", ts.Progress.Message, o.s3.Endpoint)
	}
	if ts.Retried != 0 {
		t.Errorf("segment %s used up %d retries waiting for the object store", ts.ID, ts.Retried)
	}
	waitOutput(t, o.env, regexp.MustCompile(`waiting for the object store at http://\S+ to answer \(`), time.Minute, "status", ts.ID)

	o.s3.Start()
	o.wantDone(t, 3*time.Minute)
	snap, err := o.q.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, ts := range snap.Tasks {
		if ts.Kind == scheduler.KindTrainSegment && ts.Retried != 0 {
			t.Errorf("segment %s (%s) was retried %d times", ts.ID, ts.State, ts.Retried)
		}
	}
}

// A store that hangs (its process stopped: connections accepted, never
// answered) does not hold a segment's start either: the segment's process
// finds the store silent within its check, and the segment starts from
// this machine's tokenizer and checkpoint without asking it, rather than
// waiting out a stall timeout per request. Once the store answers again,
// the run is done and its last checkpoint is there.
func TestASegmentStartsFromItsDiskWhileTheStoreHangs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGSTOP of the S3 server is exercised on linux")
	}
	t.Parallel()
	o := startOutageRun(t)
	resume := o.s3.Freeze()
	o.waitStep(t, "run outage trained to step 40 while the store hangs", 40)
	resume()
	o.wantDone(t, 5*time.Minute)
}

// outageRun is the run outage, 40 steps in segments of 20, over a real S3
// server, served by a `sched worker` of the gpu queue.
type outageRun struct {
	env []string
	rdb *redis.Client
	q   *scheduler.Client
	s3  *testsvc.S3Server
}

// startOutageRun is trainingSetup with a real S3 server and the run
// outage, enqueued and training.
func startOutageRun(t *testing.T) *outageRun {
	t.Helper()
	o := &outageRun{}
	o.env, o.rdb, o.q = trainingSetup(t)
	o.s3 = testsvc.S3(t)
	o.env = append(o.env, "KILN_S3_ENDPOINT="+o.s3.Endpoint, "KILN_S3_ACCESS_KEY="+o.s3.AccessKey, "KILN_S3_SECRET_KEY="+o.s3.SecretKey,
		"KILN_SHUTDOWN_GRACE=4s")
	appendRuns(t, o.env, "outage:\n  from: eta\n  total_steps: 40\n  segment: {max_steps: 20}\n")
	startWorker(t, o.env, "--queues", "gpu=1")
	out, errOut, code := sched(t, o.env, "enqueue", "train", "outage")
	if code != 0 {
		t.Fatalf("enqueue train outage: exit %d: %s%s", code, out, errOut)
	}
	o.waitStep(t, "run outage training", 1)
	return o
}

// waitStep waits until run outage's state records step or a later one.
func (o *outageRun) waitStep(t *testing.T, what string, step int) {
	t.Helper()
	waitUntil(t, what, func() bool {
		st, ok, err := scheduler.ReadRunState(context.Background(), o.rdb, "outage")
		return err == nil && ok && st.Step >= step
	})
}

// wantDone waits for `sched status` to show run outage done, and wants
// its last checkpoint, step 40, in object storage.
func (o *outageRun) wantDone(t *testing.T, within time.Duration) {
	t.Helper()
	waitOutput(t, o.env, regexp.MustCompile(`(?m)^outage  done  `), within, "status")
	obj, err := store.NewS3(store.S3Options{Endpoint: o.s3.Endpoint, Bucket: "kiln", AccessKey: o.s3.AccessKey, SecretKey: o.s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if steps, err := segment.RemoteSteps(context.Background(), obj, "outage"); err != nil || len(steps) == 0 || steps[len(steps)-1] != 40 {
		t.Errorf("run outage's checkpoints in object storage: %v, %v; want the last, step 40", steps, err)
	}
}

// waitUntil polls cond until it holds; its bound is for a condition that
// would never hold, not for one that is slow.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 3 minutes", what)
		}
	}
}
