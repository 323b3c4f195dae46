package worker

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

const kindNoop = "test:noop"

type noopArgs struct{ N int }

func (noopArgs) Kind() string { return kindNoop }

func init() { scheduler.Define(kindNoop, testPolicy) }

// noopHandlers serve noopArgs.
var noopHandlers = Handlers{Extra: []Handler{HandlerFunc(func(ctx context.Context, a noopArgs) error { return nil })}}

// BenchmarkPerTaskOverhead runs n no-op tasks through kiln's worker (typed
// decode, middleware, progress writes, logging to a no-op logger) and
// through a bare asynq server with a no-op handler, on the same Redis, so
// the difference is kiln's per-task overhead.
func BenchmarkPerTaskOverhead(b *testing.B) {
	const n = 2000
	for _, mode := range []string{"bare-asynq", "kiln-worker"} {
		b.Run(mode, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				r := testsvc.StartRedis(b)
				opt, _ := asynq.ParseRedisURI(r.URL(0))
				c := scheduler.NewClient(opt)
				args := make([]scheduler.Args, n)
				for j := range args {
					args[j] = noopArgs{N: j}
				}
				if _, err := c.EnqueueMany(context.Background(), args, 32); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				switch mode {
				case "bare-asynq":
					srv := asynq.NewServer(opt, asynq.Config{Concurrency: 8, Queues: map[string]int{scheduler.QueueIngest: 1}, LogLevel: asynq.ErrorLevel})
					if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
						b.Fatal(err)
					}
					go func() { <-ctx.Done(); srv.Shutdown(); close(done) }()
				default:
					w, err := New(Params{Redis: opt, Queues: map[string]int{scheduler.QueueIngest: 8}, Handlers: noopHandlers, Logger: zap.NewNop()})
					if err != nil {
						b.Fatal(err)
					}
					go func() { _ = w.Run(ctx); close(done) }()
				}
				for {
					st, err := c.Status(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					if st[0].Completed == n {
						break
					}
					time.Sleep(5 * time.Millisecond)
				}
				b.StopTimer()
				cancel()
				<-done
				c.Close()
				r.Stop()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/task")
		})
	}
}

// BenchmarkIdlePickup measures one task's time from enqueue to completion
// on an otherwise idle worker, at the default TaskCheckInterval and at
// asynq's own 1s: the gap is what the idle poll adds to each task.
func BenchmarkIdlePickup(b *testing.B) {
	for _, tc := range []struct {
		name  string
		every time.Duration
	}{{"default", 0}, {"asynq-1s", time.Second}} {
		b.Run(tc.name, func(b *testing.B) {
			r := testsvc.StartRedis(b)
			opt, _ := asynq.ParseRedisURI(r.URL(0))
			c := scheduler.NewClient(opt)
			defer c.Close()
			w, err := New(Params{Redis: opt, Queues: map[string]int{scheduler.QueueIngest: 1}, Handlers: noopHandlers, Logger: zap.NewNop(), TaskCheckInterval: tc.every})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = w.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Enqueue(context.Background(), noopArgs{N: 1_000_000 + i}); err != nil {
					b.Fatal(err)
				}
				for {
					st, err := c.Status(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					if st[0].Completed == i+1 {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
}
