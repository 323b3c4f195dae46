package worker

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
)

// A plan reads its store's status in object storage and queues only the
// files the status does not list. The worker that appends watches its
// disk and mends the status of a store that went (WatchStores), but only
// at its next look, a second later: a plan that another worker runs
// (compose's worker-ingest) in that second would read the status of a
// store no longer there, take every file for stored and queue nothing.
// So the plan asks the watching worker, through Redis, to look now, and
// reads the status once a look that began after the question has ended.
// The keys below carry the question and the answer.

// StoresLookChannel is the Redis channel on which a plan asks the worker
// that watches the token stores to look at them now.
const StoresLookChannel = "kiln:stores:look"

// StoresLooksKey is the Redis hash that numbers the watching worker's
// looks at its stores: "started" counts the looks begun, "finished" is
// the largest number of a look ended (its stores' statuses mended).
const StoresLooksKey = "kiln:stores:looks"

// StoresWatchedKey exists while a worker watches its token stores: it
// lapses a few looks' time after the last one, so that a plan does not
// wait for a worker that has stopped.
const StoresWatchedKey = "kiln:stores:watched"

// StoresDamagedKey is the Redis hash of the token stores that the worker
// holding them found damaged, each store's name to how it is damaged and
// what to do (ingest.StoreStatus.Damaged): sched status lists them. The
// watching worker writes it whole at its first look and whenever they
// change.
const StoresDamagedKey = "kiln:stores:damaged"

// StoresDeletedKey is the Redis hash of the token stores that the worker
// holding them found gone from its disk, each store's name to when it
// noticed (RFC 3339): sched status tells an ingest it lists as done, from
// the tasks' history, from one whose store went after it.
const StoresDeletedKey = "kiln:stores:deleted"

// sayDeleted records in StoresDeletedKey the stores of rs, a look's or a
// start's mended statuses, found gone, and forgets those found holding
// files again (a backup put back, a store copied from another machine):
// what the ingests before its deletion appended is there again.
func (c *Ingest) sayDeleted(ctx context.Context, rs []ingest.Reconciled) error {
	if c.Redis == nil {
		return nil
	}
	now := time.Now().UTC().Format(time.RFC3339Nano)
	var gone []any
	var back []string
	for _, r := range rs {
		switch {
		case r.Gone:
			gone = append(gone, r.Store, now)
		case r.Damaged == "" && r.Holds > 0:
			back = append(back, r.Store)
		}
	}
	if len(back) > 0 {
		if err := c.Redis.HDel(ctx, StoresDeletedKey, back...).Err(); err != nil {
			return err
		}
	}
	if len(gone) == 0 {
		return nil
	}
	return c.Redis.HSet(ctx, StoresDeletedKey, gone...).Err()
}

// DeletedStores reads StoresDeletedKey: when the worker holding the token
// stores found each store gone from its disk, by name. A store filled
// again by an ingest keeps its time (what was ingested after it is in the
// store); one put back whole is forgotten.
func DeletedStores(ctx context.Context, rdb redis.UniversalClient) (map[string]time.Time, error) {
	all, err := rdb.HGetAll(ctx, StoresDeletedKey).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(all))
	for name, at := range all {
		if t, err := time.Parse(time.RFC3339Nano, at); err == nil {
			out[name] = t
		}
	}
	return out, nil
}

// sayDamagedMu holds each sayDamaged from its reading of the watch to its
// write, and guards Ingest.saidDamaged: a look that read before another's
// Check wrote before it too, so that no older word is written over a
// newer one.
var sayDamagedMu sync.Mutex

// sayDamaged writes the stores c.Stores found damaged at its last look to
// StoresDamagedKey, in place of what it held, where they differ from what
// this worker last wrote there: a look, every second and before each
// plan, costs Redis nothing while they stay the same.
func (c *Ingest) sayDamaged(ctx context.Context) error {
	if c.Redis == nil || c.Stores == nil {
		return nil
	}
	sayDamagedMu.Lock()
	defer sayDamagedMu.Unlock()
	damaged := c.Stores.Damaged()
	if c.saidDamaged != nil && maps.Equal(*c.saidDamaged, damaged) {
		return nil
	}
	_, err := c.Redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, StoresDamagedKey)
		if len(damaged) > 0 {
			p.HSet(ctx, StoresDamagedKey, damaged)
		}
		return nil
	})
	if err == nil {
		c.saidDamaged = &damaged
	}
	return err
}

// DamagedStores reads StoresDamagedKey: the token stores found damaged,
// by name.
func DamagedStores(ctx context.Context, rdb redis.UniversalClient) (map[string]string, error) {
	return rdb.HGetAll(ctx, StoresDamagedKey).Result()
}

// lookFinished records look n as ended: "finished" only ever grows, so
// that a short look ending after a longer later one takes nothing back.
// It renews StoresWatchedKey for ARGV[2] ms.
var lookFinished = redis.NewScript(`
local f = tonumber(redis.call('HGET', KEYS[1], 'finished') or '0')
if tonumber(ARGV[1]) > f then redis.call('HSET', KEYS[1], 'finished', ARGV[1]) end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return 1
`)

// watchedFor is how long StoresWatchedKey outlives the look that set it,
// for a watch that looks every `every`.
func watchedFor(every time.Duration) time.Duration { return 3*every + 2*time.Second }

// announceWatch says that this worker watches its stores, before its
// first look; nothing where c has no Redis.
func (c *Ingest) announceWatch(ctx context.Context, every time.Duration) error {
	if c.Redis == nil {
		return nil
	}
	return c.Redis.Set(ctx, StoresWatchedKey, "1", watchedFor(every)).Err()
}

// keepWatched renews StoresWatchedKey every `every` until ctx ends or
// the watch stops (the worker no longer holds the stores), after which
// the key lapses.
func (c *Ingest) keepWatched(ctx context.Context, every time.Duration) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	repeat(ctx, every, func() {
		if c.Stores == nil || c.Stores.Stopped() {
			stop()
			return
		}
		// A failure is the next beat's to mend, within the key's life.
		_ = c.announceWatch(ctx, every)
	})
}

// errWatchGone is AskForALook's where the watching worker stopped
// answering (its StoresWatchedKey lapsed) before the look it was asked
// for ended.
var errWatchGone = errors.New("the worker that watches the token stores stopped saying so before the look asked of it ended")

// startLook numbers a look about to begin (0: not numbered, where c has
// no Redis or Redis does not answer; such a look answers no plan).
func (c *Ingest) startLook(ctx context.Context) int64 {
	if c.Redis == nil {
		return 0
	}
	n, err := c.Redis.HIncrBy(ctx, StoresLooksKey, "started", 1).Result()
	if err != nil {
		return 0
	}
	return n
}

// finishLook tells the plans that look n has ended.
func (c *Ingest) finishLook(ctx context.Context, n int64, every time.Duration) error {
	if c.Redis == nil || n == 0 {
		return nil
	}
	return lookFinished.Run(ctx, c.Redis, []string{StoresLooksKey, StoresWatchedKey}, n, watchedFor(every).Milliseconds()).Err()
}

// lookPoll is how often a plan that asked for a look reads whether it has
// ended: a look takes a listing of the stores' directory, and a request
// to object storage for each store that changed.
const lookPoll = 20 * time.Millisecond

// AskForALook asks the worker that holds the token stores, through the
// Redis rdb, to look at them, and returns once a look that began after
// the question has ended, so that statuses read then say what that
// worker's disk holds now: a plan on another worker asks before it reads
// its store's status, and an enqueue before it refuses a store whose
// status says it is damaged (deleted since, maybe). It returns at once
// where no worker watches its stores (none serves append, or one of a
// kiln from before the watch), and as soon as the watching worker stops
// (its StoresWatchedKey lapses: errWatchGone). An error says only that
// the caller goes on without the look.
func AskForALook(ctx context.Context, rdb redis.UniversalClient) error {
	if rdb == nil {
		return nil
	}
	watched, err := rdb.Exists(ctx, StoresWatchedKey).Result()
	if err != nil || watched == 0 {
		return err
	}
	s, err := rdb.HGet(ctx, StoresLooksKey, "started").Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	asked, _ := strconv.ParseInt(s, 10, 64)
	if err := rdb.Publish(ctx, StoresLookChannel, asked).Err(); err != nil {
		return err
	}
	t := time.NewTicker(lookPoll)
	defer t.Stop()
	for {
		pipe := rdb.Pipeline()
		exists := pipe.Exists(ctx, StoresWatchedKey)
		finished := pipe.HGet(ctx, StoresLooksKey, "finished")
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if f, _ := strconv.ParseInt(finished.Val(), 10, 64); f > asked {
			return nil
		}
		if exists.Val() == 0 {
			return errWatchGone
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// lookAtStores makes the statuses a plan is about to read say what the
// disk of the worker that holds the stores holds now: on that worker by
// looking itself, on another by asking it.
func (c *Ingest) lookAtStores(ctx context.Context) {
	if c.Stores != nil {
		c.checkStores(ctx, c.Pipeline.Logger)
		return
	}
	if err := AskForALook(ctx, c.Redis); err != nil && ctx.Err() == nil && c.Pipeline.Logger != nil {
		c.Pipeline.Logger.Warn("the worker that holds the token stores was not asked to look at them before this plan read their statuses; "+
			"a store deleted from its disk in the last second may be taken for stored: queue the ingest again if it plans nothing",
			zap.Error(err))
	}
}
