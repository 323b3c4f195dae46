package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// While Redis does not answer, the task queue logs an error for every
// poll of every queue's server (several a second), none of which says
// more than the first. redisDown folds them into what the person
// watching the log needs: one warning when Redis stops answering, a
// reminder while it stays down, and one line when it answers again. The
// queue's other errors are logged as they come.
type redisDown struct {
	log  *zap.Logger
	addr string
	// ping asks Redis whether it answers.
	ping func(context.Context) error
	// every is how often ping asks while Redis is down; remind how often
	// the log says it still is.
	every, remind time.Duration

	mu sync.Mutex
	// since is when the queue's first error of a possible outage came
	// (zero while Redis answers); first is that error, and said whether
	// a ping has confirmed the outage and the log said so.
	since  time.Time
	first  string
	said   bool
	hidden int // the queue's errors left out since then
	closed bool
	stop   chan struct{}
	done   chan struct{} // closed when the watch that runs while down ends
}

// Reminders of an outage, and the ping that looks for its end.
const (
	redisDownRemind = 5 * time.Minute
	redisDownPing   = 2 * time.Second
)

func newRedisDown(log *zap.Logger, addr string, ping func(context.Context) error) *redisDown {
	return &redisDown{log: log, addr: addr, ping: ping, every: redisDownPing, remind: redisDownRemind, stop: make(chan struct{})}
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

// hide reports whether the queue's error msg is one of an outage, which
// the watch it starts (or that runs) says instead.
func (d *redisDown) hide(msg string) bool {
	if !unreachable(msg) {
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
	d.since, d.first, d.said, d.hidden = time.Now(), msg, false, 0
	d.done = make(chan struct{})
	go d.watch(d.done)
	return true
}

// watch asks Redis at once and then every d.every until it answers. An
// outage it confirms is said once, reminded every d.remind, and its end
// said with how long it lasted. An error of the queue that Redis
// answering at once belies (a command that failed just before Redis came
// back, logged after) is no outage, and is only logged at debug level.
func (d *redisDown) watch(done chan struct{}) {
	defer close(done)
	t := time.NewTicker(d.every)
	defer t.Stop()
	var last time.Time
	for {
		ctx, cancel := context.WithTimeout(context.Background(), d.every)
		err := d.ping(ctx)
		cancel()
		d.mu.Lock()
		down := time.Since(d.since).Round(time.Second)
		switch {
		case err == nil && d.said:
			d.log.Info("Redis answers again", zap.String("redis", d.addr), zap.Duration("down", down),
				zap.Int("errors_left_out", d.hidden))
		case err == nil:
			d.log.Debug("the task queue's error, with Redis answering", zap.String("redis", d.addr), zap.String("error", d.first),
				zap.Int("errors_left_out", d.hidden))
		case !d.said:
			d.said, last = true, time.Now()
			d.log.Warn("Redis does not answer: the worker waits for it and takes no new task; tasks in progress go on "+
				"(a training segment stops at a step boundary if Redis stays down past its run's lock lease). "+
				"The task queue's errors about it are left out until Redis answers",
				zap.String("redis", d.addr), zap.String("error", d.first), zap.NamedError("ping", err))
		case time.Since(last) >= d.remind:
			last = time.Now()
			d.log.Warn(fmt.Sprintf("Redis still does not answer after %s: the worker waits for it", down),
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
