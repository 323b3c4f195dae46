package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// While Redis does not answer, the task queue logs an error for every
// poll of every queue's server (several a second), none of which says
// more than the first. redisDown folds them into what the person
// watching the log needs: one warning when Redis stops answering, a
// reminder while it stays down, and one line when it answers again. The
// same for a Redis that answers and refuses every write because it is
// full (its maxmemory reached, under the noeviction policy kiln
// requires): its refusals are no outage, and the line says so and how to
// give it room. The queue's other errors are logged as they come.
type redisDown struct {
	log  *zap.Logger
	addr string
	// probe makes a write that changes nothing: it fails while Redis does
	// not answer, and is refused while Redis is full, which still answers
	// a ping.
	probe func(context.Context) error
	// every is how often probe asks while Redis is down or full; remind
	// how often the log says it still is.
	every, remind time.Duration

	mu sync.Mutex
	// since is when the queue's first error of a possible outage came
	// (zero while Redis takes writes); first is that error, and said what
	// the log has said of the outage: "" (nothing yet: no probe has
	// confirmed it), redisNotAnswering or redisFull.
	since  time.Time
	first  string
	said   string
	hidden int // the queue's errors left out since then
	closed bool
	stop   chan struct{}
	done   chan struct{} // closed when the watch that runs while down ends
}

// What an outage is, as a probe finds it.
const (
	redisNotAnswering = "down"
	redisFull         = "full"
)

// Reminders of an outage, and the probe that looks for its end.
const (
	redisDownRemind = 5 * time.Minute
	redisDownPing   = 2 * time.Second
)

func newRedisDown(log *zap.Logger, addr string, probe func(context.Context) error) *redisDown {
	return &redisDown{log: log, addr: addr, probe: probe, every: redisDownPing, remind: redisDownRemind, stop: make(chan struct{})}
}

// writeProbeKey is a key no one writes: SET with XX writes nothing where
// the key is absent, and Redis refuses it all the same while full, as it
// refuses every command that may take memory.
const writeProbeKey = "kiln:probe:never-set"

// probeWrite is redisDown's probe: a write that changes nothing.
func probeWrite(ctx context.Context, rdb redis.UniversalClient) error {
	return rdb.SetXX(ctx, writeProbeKey, "", 0).Err()
}

// unreachable reports whether a message of the task queue is Redis not
// answering: the connection refused, reset or timed out, the host not
// found, or Redis still loading its data. The queue wraps these errors
// into its own words, so the text is all there is to go on.
func unreachable(msg string) bool {
	for _, s := range []string{"connection refused", "i/o timeout", "connection reset", "broken pipe", "no route to host",
		"network is unreachable", "no such host", "use of closed network connection", "LOADING", ": EOF", "connection pool timeout"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// hide reports whether the queue's error msg is one of an outage, Redis
// not answering or refusing writes for memory, which the watch it starts
// (or that runs) says instead.
func (d *redisDown) hide(msg string) bool {
	if !unreachable(msg) && !redismem.RefusedIn(msg) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.since.IsZero() {
		d.hidden++
		return true
	}
	if d.closed {
		return false
	}
	d.since, d.first, d.said, d.hidden = time.Now(), msg, "", 0
	d.done = make(chan struct{})
	go d.watch(d.done)
	return true
}

// watch asks Redis at once and then every d.every until it takes a write.
// An outage it confirms is said once, again where it turns from one kind
// to the other (Redis not answering, or full), reminded every d.remind,
// and its end said with how long it lasted. An error of the queue that
// Redis taking a write at once belies (a command that failed just before
// Redis came back, logged after) is no outage, and is only logged at
// debug level.
func (d *redisDown) watch(done chan struct{}) {
	defer close(done)
	t := time.NewTicker(d.every)
	defer t.Stop()
	var last time.Time
	for {
		ctx, cancel := context.WithTimeout(context.Background(), d.every)
		err := d.probe(ctx)
		cancel()
		now := redisNotAnswering
		switch {
		case err == nil:
			now = ""
		case redismem.Refused(err):
			now = redisFull
		}
		d.mu.Lock()
		lasted := time.Since(d.since).Round(time.Second)
		switch {
		case now == "" && d.said == redisNotAnswering:
			d.log.Info("Redis answers again", zap.String("redis", d.addr), zap.Duration("down", lasted),
				zap.Int("errors_left_out", d.hidden))
		case now == "" && d.said == redisFull:
			d.log.Info("Redis takes writes again: it has room", zap.String("redis", d.addr), zap.Duration("full", lasted),
				zap.Int("errors_left_out", d.hidden))
		case now == "":
			d.log.Debug("the task queue's error, with Redis answering", zap.String("redis", d.addr), zap.String("error", d.first),
				zap.Int("errors_left_out", d.hidden))
		case now != d.said && now == redisFull:
			d.said, last = now, time.Now()
			d.log.Warn("Redis refuses writes because it is full (its used memory is over its maxmemory); it answers, and loses nothing. "+
				"Until it has room the worker takes no new task and cannot write its heartbeat, its tasks' progress or their leases "+
				"('sched status' says Redis is full): a task in progress stops once its lease in the queue lapses (30 s; a training "+
				"segment at a step boundary, with its checkpoint) and runs again once Redis has room. To go on, "+redismem.Remedy+
				". The task queue's errors about it are left out until Redis takes writes again",
				zap.String("redis", d.addr), zap.String("error", d.first), zap.NamedError("probe", err))
		case now != d.said:
			d.said, last = now, time.Now()
			d.log.Warn("Redis does not answer: the worker waits for it and takes no new task; tasks in progress go on "+
				"(a training segment stops at a step boundary if Redis stays down past its run's lock lease). "+
				"The task queue's errors about it are left out until Redis answers",
				zap.String("redis", d.addr), zap.String("error", d.first), zap.NamedError("ping", err))
		case time.Since(last) >= d.remind && now == redisFull:
			last = time.Now()
			d.log.Warn(fmt.Sprintf("Redis still refuses writes after %s: it is full; raise its maxmemory (redis-cli CONFIG SET maxmemory <size>)", lasted),
				zap.String("redis", d.addr), zap.Error(err), zap.Int("errors_left_out", d.hidden))
		case time.Since(last) >= d.remind:
			last = time.Now()
			d.log.Warn(fmt.Sprintf("Redis still does not answer after %s: the worker waits for it", lasted),
				zap.String("redis", d.addr), zap.Error(err), zap.Int("errors_left_out", d.hidden))
		}
		if err == nil {
			d.since = time.Time{}
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
	}
}

// close ends the watch, if one runs, before the worker closes its client.
func (d *redisDown) close() {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	close(d.stop)
	done := d.done
	d.mu.Unlock()
	if done != nil {
		<-done
	}
}
