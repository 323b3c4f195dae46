package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// ErrRunLocked means another worker holds the run; the task should be retried
// later, not failed.
var ErrRunLocked = errors.New("run is locked by another worker")

// ErrRunLockLost means this worker's lock expired or was taken over while it
// trained: everything it would write from now on is stale and refused.
var ErrRunLockLost = errors.New("run lock lost")

// RunLock keeps one run from being trained by two workers at once. Each
// acquisition draws a fencing token from a per-run counter that only grows;
// every write that must not come from a stale holder (a checkpoint's
// completion, the run's state) is made through Fenced, which Redis refuses
// unless the caller's token is still the newest. A worker that paused past
// its lease (a long GC, a frozen VM, a network partition) therefore cannot
// overwrite the work of the worker that took over.
type RunLock struct {
	rdb   redis.UniversalClient
	run   string
	value string // "<token>:<owner>", the lock key's value while held
	token int64
	ttl   time.Duration
	log   *zap.Logger

	mu     sync.Mutex
	lostCh chan struct{}
	lost   bool
	stop   context.CancelFunc
	done   chan struct{}
}

// RunLockKey is the key of run's lock; while held its value names the
// holder ("<token>:<owner>").
func RunLockKey(run string) string { return "kiln:run:" + run + ":lock" }

func runFenceKey(run string) string { return "kiln:run:" + run + ":fence" }

// RunStateKey is the hash that holds a run's progress for `sched status`:
// written only through Fenced.
func RunStateKey(run string) string { return "kiln:run:" + run + ":state" }

var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local t = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], t .. ':' .. ARGV[1], 'PX', ARGV[2])
return {t, ''}
`)

var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// fencedHSetScript sets fields of KEYS[3] only while ARGV[1] is the newest
// token and the lock still holds ARGV[2].
var fencedHSetScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[1] or redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i+1])
end
return 1
`)

// AcquireRun takes the run's lock for owner (a worker's name, shown to whoever
// finds the run locked) with a lease of ttl, and keeps renewing it every
// ttl/3 until Release. ErrRunLocked, wrapped with the holder's name, means
// another worker has it.
func AcquireRun(ctx context.Context, rdb redis.UniversalClient, run, owner string, ttl time.Duration, log *zap.Logger) (*RunLock, error) {
	if ttl < 30*time.Millisecond {
		return nil, fmt.Errorf("lock run %s: lease %v is too short to renew", run, ttl)
	}
	if log == nil {
		log = zap.NewNop()
	}
	res, err := acquireScript.Run(ctx, rdb, []string{RunLockKey(run), runFenceKey(run)}, owner, ttl.Milliseconds()).Slice()
	if err != nil {
		return nil, fmt.Errorf("lock run %s: %w", run, err)
	}
	token, _ := res[0].(int64)
	if token == 0 {
		holder, _ := res[1].(string)
		_, who, _ := strings.Cut(holder, ":")
		return nil, fmt.Errorf("%w: run %s is being trained by %s", ErrRunLocked, run, who)
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	l := &RunLock{
		rdb: rdb, run: run, token: token, ttl: ttl, log: log,
		value:  strconv.FormatInt(token, 10) + ":" + owner,
		lostCh: make(chan struct{}), stop: stop, done: make(chan struct{}),
	}
	go l.keepAlive(rctx)
	return l, nil
}

// Token is this holder's fencing token.
func (l *RunLock) Token() int64 { return l.token }

// Lost is closed once the lock can no longer be trusted.
func (l *RunLock) Lost() <-chan struct{} { return l.lostCh }

func (l *RunLock) markLost(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.lost {
		l.lost = true
		close(l.lostCh)
		l.log.Warn("run lock lost", zap.String("run", l.run), zap.Int64("token", l.token), zap.String("why", why))
	}
}

// keepAlive renews the lease. A renewal that Redis refuses means another
// worker holds the run now; renewals that fail to reach Redis are retried
// until the lease would have run out, since after that another worker may
// have taken over.
func (l *RunLock) keepAlive(ctx context.Context) {
	defer close(l.done)
	every := l.ttl / 3
	t := time.NewTicker(every)
	defer t.Stop()
	lastOK := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		n, err := renewScript.Run(rctx, l.rdb, []string{RunLockKey(l.run)}, l.value, l.ttl.Milliseconds()).Int64()
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if time.Since(lastOK) >= l.ttl {
				l.markLost("redis unreachable for the whole lease: " + err.Error())
				return
			}
			l.log.Warn("renew run lock", zap.String("run", l.run), zap.Error(err))
		case n == 0:
			l.markLost("another worker holds the lock")
			return
		default:
			lastOK = time.Now()
		}
	}
}

// Fenced sets fields of the run's state hash only while this holder's token
// is the newest and its lease still holds; otherwise it returns ErrRunLockLost
// and writes nothing.
func (l *RunLock) Fenced(ctx context.Context, fields map[string]string) error {
	args := []any{strconv.FormatInt(l.token, 10), l.value}
	for k, v := range fields {
		args = append(args, k, v)
	}
	n, err := fencedHSetScript.Run(ctx, l.rdb, []string{RunLockKey(l.run), runFenceKey(l.run), RunStateKey(l.run)}, args...).Int64()
	if err != nil {
		return fmt.Errorf("fenced write for run %s: %w", l.run, err)
	}
	if n == 0 {
		l.markLost("a fenced write was refused")
		return fmt.Errorf("%w: run %s: token %d is no longer the newest", ErrRunLockLost, l.run, l.token)
	}
	return nil
}

// Check is Fenced with nothing to write: it says whether this holder may
// still write, immediately before a write that Redis cannot guard itself
// (a checkpoint's completion marker in object storage).
func (l *RunLock) Check(ctx context.Context) error { return l.Fenced(ctx, nil) }

// Release stops renewing and deletes the lock if it is still this holder's.
func (l *RunLock) Release(ctx context.Context) error {
	l.stop()
	<-l.done
	if _, err := releaseScript.Run(ctx, l.rdb, []string{RunLockKey(l.run)}, l.value).Result(); err != nil {
		return fmt.Errorf("release lock of run %s: %w", l.run, err)
	}
	return nil
}
