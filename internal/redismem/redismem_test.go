package redismem

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// fill makes r full: a maxmemory below what it uses, under the
// noeviction policy testsvc starts it with (as compose does), refuses
// every write and answers reads. empty gives it room again.
func fill(t *testing.T, rdb *redis.Client) {
	t.Helper()
	if err := rdb.ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
}

func empty(t *testing.T, rdb *redis.Client) {
	t.Helper()
	if err := rdb.ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
}

// A real redis-server at its maxmemory refuses writes, in a command of
// its own and in the task queue's: Refused knows both, Read says it is
// full, and Wrap says so in words with what to do. With room again it
// takes writes, and neither says full.
func TestAFullRedisIsToldFromOneThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	q := asynq.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	t.Cleanup(func() { q.Close() })

	m, err := Read(ctx, rdb)
	if err != nil || m.Used <= 0 || m.Max != 0 || m.Full() {
		t.Fatalf("INFO memory of a Redis without maxmemory: %+v, %v; want its used memory, no limit and not full", m, err)
	}

	fill(t, rdb)
	m, err = Read(ctx, rdb)
	if err != nil || m.Max != 1 || !m.Full() {
		t.Fatalf("INFO memory of a full Redis: %+v, %v; want maxmemory 1 and full", m, err)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("a full Redis does not answer a ping: %v", err)
	}
	set := rdb.Set(ctx, "k", "v", 0).Err()
	if !Refused(set) {
		t.Fatalf("a write to a full Redis: %v; want it Refused", set)
	}
	_, enq := q.Enqueue(asynq.NewTask("kind", nil))
	if !Refused(enq) {
		t.Fatalf("the task queue's enqueue into a full Redis: %v; want it Refused", enq)
	}
	err = Wrap("enqueue kind", enq)
	var full *FullError
	if !errors.As(err, &full) || !errors.Is(err, enq) {
		t.Fatalf("Wrap of the refusal: %#v; want a *FullError wrapping it", err)
	}
	msg := err.Error()
	for _, want := range []string{"enqueue kind: Redis refused the write because it is full",
		`it answered "OOM command not allowed when used memory > 'maxmemory'."`, "redis-cli CONFIG SET maxmemory", "KILN_REDIS_MAXMEMORY=<size> in .env"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Wrap says %q; want %q in it", msg, want)
		}
	}
	for _, not := range []string{"UNKNOWN", "redis command error"} {
		if strings.Contains(msg, not) {
			t.Errorf("Wrap says %q; want the task queue's words (%q) left out", msg, not)
		}
	}
	// Wrapped again, it is named as any error is, and said once.
	if again := Wrap("run", err).Error(); again != "run: "+msg {
		t.Errorf("Wrap of a FullError: %q; want it named by what failed, as it was", again)
	}

	empty(t, rdb)
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("a write once Redis has room: %v", err)
	}
	if m, err := Read(ctx, rdb); err != nil || m.Full() {
		t.Fatalf("INFO memory once Redis has room: %+v, %v; want not full", m, err)
	}

	// Redis not answering is no refusal.
	r.Stop()
	down := rdb.Set(ctx, "k", "v", 0).Err()
	if down == nil || Refused(down) {
		t.Fatalf("a write to a stopped Redis: %v; want an error that is not Refused", down)
	}
	if got := Wrap("write", down); got.Error() != "write: "+down.Error() || !errors.Is(got, down) {
		t.Errorf("Wrap of another error: %q; want it named by what failed, wrapped", got)
	}
	if Wrap("write", nil) != nil {
		t.Error("Wrap of nil is not nil")
	}
}
