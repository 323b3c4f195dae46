package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/scheduler"
)

const kindReleased = "test:released"

// releasedArgs is a task whose handler returns once the channel of its
// name in releases is closed.
type releasedArgs struct{ Name string }

func (releasedArgs) Kind() string { return kindReleased }

var releases sync.Map

func init() { scheduler.Define(kindReleased, testPolicy) }

// A task that ends while Redis does not answer is recorded done once Redis
// answers, its attempt its first, where asynq's one write of its end
// failed and its later tries failed at once: the task stayed active until
// its lease lapsed, read as its worker lost, and ran again a minute and
// more later as a failure that used a retry. Its last state, whose write
// failed, is written once Redis answers.
func TestATaskThatEndsWhileRedisIsDownIsRecordedOnceItAnswers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	core, logs := observer.New(zap.InfoLevel)
	release := make(chan struct{})
	releases.Store(t.Name(), release)
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueIngest: 1}, Logger: zap.New(core), ProgressEvery: time.Millisecond,
		Handlers: Handlers{Extra: []Handler{HandlerFunc(func(ctx context.Context, a releasedArgs) error {
			ch, _ := releases.Load(a.Name)
			<-ch.(chan struct{})
			return nil
		})}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	id := e.enqueue(releasedArgs{Name: t.Name()})
	e.waitFor(id, time.Minute, "running", state("active"))
	e.redis.Stop()
	close(release)
	for deadline := time.Now().Add(time.Minute); logs.FilterMessageSnippet("the task ended while Redis does not answer").Len() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the worker did not hold the end of the task while Redis did not answer")
		}
	}
	e.redis.Start()
	ts := e.waitFor(id, time.Minute, "completed, or run again", func(ts scheduler.TaskStatus) bool { return ts.State == "completed" || ts.Retried > 0 })
	if ts.State != "completed" || ts.Retried != 0 || ts.Progress.State != "done" {
		t.Fatalf("the task that ended while Redis was down: %s, retried %d, progress %s; want completed on its first attempt, its progress done", ts.State, ts.Retried, ts.Progress.State)
	}
}
