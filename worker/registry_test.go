package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/redis/go-redis/v9"
)

// A worker missing a dependency of one of its handlers is refused when it
// is built, with the field named, not when its first task arrives.
func TestNewRefusesAMissingDependency(t *testing.T) {
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(context.Context, scheduler.Args) error { return nil }
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	opt := asynq.RedisClientOpt{Addr: "127.0.0.1:1"}
	for _, c := range []struct {
		name   string
		queues map[string]int
		hs     Handlers
		want   string
	}{
		{"no handlers", map[string]int{scheduler.QueueIngest: 1}, Handlers{}, "queue ingest is served but no handler"},
		{"ingest without objects", map[string]int{scheduler.QueueIngest: 1},
			Handlers{Ingest: &Ingest{Enqueue: enqueue}}, "Handlers.Ingest.Pipeline.Objects is required"},
		{"ingest without enqueue", map[string]int{scheduler.QueueIngest: 1},
			Handlers{Ingest: &Ingest{Pipeline: ingest.Pipeline{Objects: objects}}}, "Handlers.Ingest.Enqueue is required"},
		{"tokenizers without a data directory", map[string]int{scheduler.QueueIngest: 1},
			Handlers{Tokenizers: &Tokenizers{Objects: objects, Enqueue: enqueue}}, "Handlers.Tokenizers.DataDir is required"},
		{"training without redis", map[string]int{scheduler.QueueGPU: 1},
			Handlers{Training: &Training{Objects: objects, Enqueue: enqueue, Dir: t.TempDir()}}, "Handlers.Training.Redis is required"},
		{"training without a run directory", map[string]int{scheduler.QueueGPU: 1},
			Handlers{Training: &Training{Redis: rdb, Objects: objects, Enqueue: enqueue}}, "Handlers.Training.Dir is required"},
		{"a queue nobody handles", map[string]int{scheduler.QueueGPU: 1},
			Handlers{Ingest: &Ingest{Pipeline: ingest.Pipeline{Objects: objects}, Enqueue: enqueue}}, "queue gpu is served but no handler"},
		{"two handlers of one kind", map[string]int{scheduler.QueueIngest: 1},
			Handlers{Extra: []Handler{HandlerFunc(slow), HandlerFunc(slow)}}, "two handlers for kind " + kindSlow},
	} {
		_, err := New(Params{Redis: opt, Queues: c.queues, Handlers: c.hs})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v; want an error containing %q", c.name, err, c.want)
		}
	}
	if _, err := New(Params{Redis: opt, Queues: map[string]int{scheduler.QueueIngest: 1},
		Handlers: Handlers{Ingest: &Ingest{Pipeline: ingest.Pipeline{Objects: objects}, Enqueue: enqueue}}}); err != nil {
		t.Errorf("New with every dependency: %v", err)
	}
}
