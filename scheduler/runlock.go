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

	"github.com/kiln-lm/kiln/internal/redismem"
)

// ErrRunLocked means another worker holds the run; the task should be retried
// later, not failed.
var ErrRunLocked = errors.New("run is locked by another worker")

// ErrRunLockLost means another worker holds the run, or took it since this
// worker's lease expired: everything this worker would write from now on is
// stale and refused. The error says which.
var ErrRunLockLost = errors.New("run lock lost")

// RunLock keeps one run from being trained by two workers at once. Each
// acquisition draws a fencing token from a per-run counter that only grows;
// every write that must not come from a stale holder (a checkpoint's
// completion, the run's state) is made through Fenced, which Redis refuses
// unless the caller's token is still the newest. A worker that paused past
// its lease (a long GC, a frozen VM, a network partition) therefore cannot
// overwrite the work of the worker that took over; one that paused past
// its lease while no worker took the run holds it again and carries on.
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

// holdScript keeps this holder's lock: it renews the lease (ARGV[4] set)
// and sets fields of KEYS[3] (ARGV[6]...) while the lock is this holder's,
// and says why not otherwise. It returns {code, lock value, newest token}:
//
//	 1  held: renewed, fields set
//	 2  the lease had expired and nobody drew a token since: held again
//	    with the same token (ARGV[5] set), fields set
//	-1  another holder's value is in the lock: taken over
//	-2  the lease expired and a newer token was drawn since (its holder
//	    may have released the run or let it lapse in turn)
//	-3  the lease expired; not taken again (ARGV[5] unset)
//
// Taking an expired lease again with the same token is safe because of
// the fence: every acquisition increments it, in the same script that sets
// the lock, so a fence still equal to this token means that no other worker
// has acquired the run since this one did. Nobody has held it in between,
// no write was fenced with a newer token, and the lock is absent, so no
// one holds it now; the check and the SET run as one script, so no acquirer
// can come between them. The holder is then where a renewal in time would
// have left it. Any acquisition in between makes the fence newer, and the
// stale holder stops (-2) as before.
var holdScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
local fence = redis.call('GET', KEYS[2]) or ''
local code = 1
if cur == ARGV[2] and fence == ARGV[1] then
  if ARGV[4] == '1' then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
elseif cur and cur ~= ARGV[2] then
  return {-1, cur, fence}
elseif fence ~= ARGV[1] then
  return {-2, '', fence}
elseif ARGV[5] ~= '1' then
  return {-3, '', fence}
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  code = 2
end
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i+1])
end
return {code, '', fence}
`)

var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
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
		return nil, redismem.Wrap("lock run "+run, err)
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
		l.log.Warn("run lock lost", zap.String("run", l.run), zap.Int64("token", l.token), zap.String("why", why))
		close(l.lostCh)
	}
}

// held is what holdScript found: its code, and why the lock is not this
// holder's when the code is negative.
type held struct {
	code int64
	why  string
}

// hold runs holdScript: renew renews the lease, retake takes an expired
// one again while no newer token was drawn, and fields are set in the
// run's state.
func (l *RunLock) hold(ctx context.Context, renew, retake bool, fields map[string]string) (held, error) {
	flag := func(b bool) string {
		if b {
			return "1"
		}
		return "0"
	}
	args := []any{strconv.FormatInt(l.token, 10), l.value, l.ttl.Milliseconds(), flag(renew), flag(retake)}
	for k, v := range fields {
		args = append(args, k, v)
	}
	res, err := holdScript.Run(ctx, l.rdb, []string{RunLockKey(l.run), runFenceKey(l.run), RunStateKey(l.run)}, args...).Slice()
	if err != nil {
		return held{}, err
	}
	if len(res) != 3 {
		return held{}, fmt.Errorf("lock script answered %v", res)
	}
	code, _ := res[0].(int64)
	cur, _ := res[1].(string)
	fence, _ := res[2].(string)
	h := held{code: code}
	switch {
	case code == -1:
		token, who, _ := strings.Cut(cur, ":")
		h.why = fmt.Sprintf("another worker holds the lock: %s, with token %s", who, token)
	case code == -2 && fence == "":
		// No acquisition removes the fence: Redis lost its data (a
		// restart without its append-only file, a flush), the run's
		// queued segment with it.
		h.why = fmt.Sprintf("the run's lock and fencing token are gone from Redis (it lost its data: restarted without its append-only file, or flushed), and its queued segment with them: 'sched enqueue train %s' resumes the run from its last checkpoint", l.run)
	case code == -2:
		h.why = fmt.Sprintf("the lease expired and another worker has taken the run since (newest token %s)", fence)
	case code == -3:
		h.why = "the lease expired after this holder stopped renewing it"
	}
	return h, nil
}

func (l *RunLock) logRetaken(fields ...zap.Field) {
	l.log.Warn("run lock's lease expired and nobody took the run: held again with the same token",
		append([]zap.Field{zap.String("run", l.run), zap.Int64("token", l.token)}, fields...)...)
}

// keepAlive renews the lease. A lease that expired while this worker was
// paused (SIGSTOP, a stalled machine) is taken again when no other worker
// took the run meanwhile; one that another worker holds, or took since,
// is lost. Renewals that fail to reach Redis are retried until the lease
// would have run out, since after that another worker may have taken over.
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
		h, err := l.hold(rctx, true, true, nil)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if time.Since(lastOK) >= l.ttl {
				why := "redis unreachable for the whole lease: "
				if redismem.Refused(err) {
					// Redis answers, and refuses writes: said as such,
					// with what to do, not as an outage.
					why = "Redis refused the lease's renewals for the whole lease because it is full (its maxmemory reached): "
				}
				l.markLost(why + err.Error())
				return
			}
			l.log.Warn("renew run lock", zap.String("run", l.run), zap.Error(err))
		case h.code < 0:
			l.markLost(h.why)
			return
		default:
			if h.code == 2 {
				l.logRetaken(zap.Duration("since_renewal", time.Since(lastOK)))
			}
			lastOK = time.Now()
		}
	}
}

// Fenced sets fields of the run's state hash only while this holder's token
// is the newest and its lease still holds; otherwise it returns ErrRunLockLost,
// saying whether another worker holds the run or took it since, and writes
// nothing. A lease that expired while nobody took the run is taken again
// first, as keepAlive would (see holdScript), unless this holder has stopped
// renewing (it lost the lock, or released it).
func (l *RunLock) Fenced(ctx context.Context, fields map[string]string) error {
	l.mu.Lock()
	retake := !l.lost
	l.mu.Unlock()
	select {
	case <-l.done:
		retake = false
	default:
	}
	h, err := l.hold(ctx, false, retake, fields)
	if err != nil {
		return redismem.Wrap("fenced write for run "+l.run, err)
	}
	if h.code < 0 {
		l.markLost(h.why)
		return fmt.Errorf("%w: run %s, token %d: %s", ErrRunLockLost, l.run, l.token, h.why)
	}
	if h.code == 2 {
		l.logRetaken()
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
