// Package redismem tells Redis refusing writes because it is full from
// Redis not answering, and reads how full it is. kiln requires the
// noeviction policy (an evicted key is a lost task or a lost lock), under
// which a Redis whose memory has reached its maxmemory keeps answering
// reads and refuses every write: the workers' heartbeats, progress, leases
// and new tasks. Nothing kept is lost, and the work goes on once it has
// room; until then what fails must say that Redis is full and how to give
// it room, not that it does not answer.
package redismem

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// refusal is how Redis's reply to a write at maxmemory begins ("OOM command
// not allowed when used memory > 'maxmemory'."), in a plain command and in
// a script's.
const refusal = "OOM command not allowed"

// Refused reports whether err is Redis refusing a write because it is full
// (its maxmemory reached). It reads err's text: the task queue wraps
// Redis's reply in its own errors, and a task's child process hands its
// error on as text.
func Refused(err error) bool {
	return err != nil && RefusedIn(err.Error())
}

// RefusedIn is Refused for a message alone: a line of the task queue's
// log, which is all there is of its errors.
func RefusedIn(msg string) bool { return strings.Contains(msg, refusal) }

// Remedy says how to give a full Redis room. CONFIG SET takes effect at
// once; compose's redis-server takes its bound from .env at its start,
// where one raised stays over a restart.
const Remedy = "raise its maxmemory (redis-cli CONFIG SET maxmemory <size>, e.g. 4gb, which takes effect at once; " +
	"under compose also set KILN_REDIS_MAXMEMORY=<size> in .env, so that a restart keeps it), " +
	"first freeing memory on its host where that has none to spare; docs/operations.md, \"Redis memory\", says what kiln keeps there"

// FullError is a write Redis refused because it is full. Its text says so
// and what to do, in place of the task queue's words for the refusal.
type FullError struct {
	// Op is what was not done: "enqueue ingest:plan".
	Op string
	// Err is the refused write's error.
	Err error
}

func (e *FullError) Error() string {
	reply := refusal
	if msg := e.Err.Error(); strings.Contains(msg, refusal) {
		reply = strings.TrimSpace(msg[strings.Index(msg, refusal):])
	}
	return fmt.Sprintf("%s: Redis refused the write because it is full (it answered %q): its used memory is over its maxmemory, "+
		"and it takes no write until it has room, though it keeps what it holds; %s", e.Op, reply, Remedy)
}

func (e *FullError) Unwrap() error { return e.Err }

// Wrap is err with what failed (op) before it: a *FullError where Redis
// refused the write for memory, "op: err" otherwise; nil for nil.
func Wrap(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case Refused(err) && !errors.As(err, new(*FullError)):
		return &FullError{Op: op, Err: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Memory is what Redis's INFO memory says of its memory.
type Memory struct {
	// Used is used_memory: the bytes its data takes, and its buffers.
	Used int64
	// Max is maxmemory; 0 where it has no limit.
	Max int64
	// NotCounted is mem_not_counted_for_evict: the buffers (the
	// append-only file's, replicas') that Redis leaves out of Used when it
	// compares it with Max.
	NotCounted int64
}

// Full reports whether Redis refuses writes for memory now: it does where
// its used memory, less what it does not count, is over maxmemory, as
// Redis itself compares them before each write.
func (m Memory) Full() bool {
	return m.Max > 0 && m.Used-m.NotCounted > m.Max
}

// Read asks Redis for its INFO memory.
func Read(ctx context.Context, rdb redis.Cmdable) (Memory, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return Memory{}, fmt.Errorf("read Redis's INFO memory: %w", err)
	}
	return parse(info)
}

// parse reads INFO memory's reply: lines of field:value.
func parse(info string) (Memory, error) {
	var m Memory
	fields := map[string]*int64{"used_memory": &m.Used, "maxmemory": &m.Max, "mem_not_counted_for_evict": &m.NotCounted}
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		p := fields[k]
		if !ok || p == nil {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Memory{}, fmt.Errorf("Redis's INFO memory: %s is %q, not a number of bytes", k, v)
		}
		*p = n
		seen[k] = true
	}
	if !seen["used_memory"] || !seen["maxmemory"] {
		short := strings.Join(strings.Fields(info), " ")
		if len(short) > 200 {
			short = short[:200] + "…"
		}
		return Memory{}, fmt.Errorf("Redis's INFO memory lacks used_memory or maxmemory: %q", short)
	}
	return m, nil
}
