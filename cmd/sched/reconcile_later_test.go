package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/worker"
)

// putElsewhere writes the status of a store named elsewhere, which no
// disk of these tests holds, and returns whether it is still there.
func putElsewhere(t *testing.T, objects store.Store) (status func() bool) {
	t.Helper()
	ctx := context.Background()
	b, err := json.Marshal(ingest.StoreStatus{Tokens: 10, Documents: 1, Bytes: 20, Shards: 1, Done: []string{"f0"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(ctx, ingest.StatusKey("elsewhere"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	return func() bool {
		t.Helper()
		_, err := objects.Stat(ctx, ingest.StatusKey("elsewhere"))
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
}

// A worker that appends, started while object storage is down, starts
// (as it should under compose or systemd) and makes the stores' statuses
// say what its disk holds once object storage is back, without a
// restart: its start could not, and the status of a store its disk lacks
// would go on saying the store's files are stored, so that an ingest
// queued none of them.
func TestAStoresWorkerStartedWhileObjectStorageIsDownMendsTheStatusesOnceItIsBack(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	status := putElsewhere(t, objects)
	srv.Stop()
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + t.TempDir(),
		"KILN_S3_ENDPOINT=" + srv.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey}
	w := startWorkerWithoutObjectStorage(t, env, "append=1")
	srv.Start()
	waitUntil(t, "the status of a store the worker's disk lacks mended", func() bool { return !status() })
	waitUntil(t, "the worker's log to say it mended store elsewhere", func() bool {
		log := workerLog(t, w)
		return strings.Contains(log, "did not say what this disk's store holds") && strings.Contains(log, `"store":"elsewhere"`)
	})
}

// A start whose mending of the statuses the append claim's lease refused
// (its renewal unconfirmed) is tried again by the store watch's looks, and
// mends the statuses once the lease holds.
func TestAStartsMendingRefusedByTheLeaseIsTriedAgainByTheWatch(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := testsvc.StartRedis(t)
	data := t.TempDir()
	objects, err := store.NewLocal(data + "/objects")
	if err != nil {
		t.Fatal(err)
	}
	status := putElsewhere(t, objects)
	cfg := scheduler.Config{RedisURL: r.URL(0), DataDir: data}.WithDefaults()
	opt, _ := asynq.ParseRedisURI(cfg.RedisURL)
	q := scheduler.NewClient(opt)
	defer q.Close()

	var live atomic.Bool
	lease := func() time.Time {
		if live.Load() {
			return time.Now().Add(time.Hour)
		}
		return time.Now().Add(-time.Second)
	}
	hs, err := workerHandlers(ctx, cfg, map[string]int{scheduler.QueueAppend: 1}, q, zap.NewNop(), lease)
	if err != nil {
		t.Fatal(err)
	}
	if !status() {
		t.Fatal("a worker whose lease had passed cleared a store's status at its start")
	}
	watching := make(chan struct{})
	go func() { defer close(watching); hs.Ingest.WatchStores(ctx, 10*time.Millisecond, zap.NewNop()) }()
	// Ended before the test's directories go.
	t.Cleanup(func() { cancel(); <-watching })
	live.Store(true)
	waitUntil(t, "the watch to mend the status once the lease holds", func() bool { return !status() })
}

// A stores worker whose append claim was gone from Redis for a while
// (Redis lost its data) makes it again and then makes the stores'
// statuses say what its disk holds again: in the gap another disk's
// worker may have held the claim and published the statuses of its own
// stores, which this disk's watch, looking only at its own stores, never
// mended.
func TestAStoresWorkerWhoseClaimWasGoneMendsTheStatusesAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	data := t.TempDir()
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_LOG_FORMAT=json", "KILN_DATA_DIR=" + data}
	w := startWorker(t, env, "--queues", "append=1")
	waitUntil(t, "the worker to watch its stores", func() bool {
		return strings.Contains(workerLog(t, w), "append queue claimed for this data directory")
	})
	objects, err := store.NewLocal(data + "/objects")
	if err != nil {
		t.Fatal(err)
	}
	// As the other disk's worker, in the gap, publishes it.
	status := putElsewhere(t, objects)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	if err := rdb.Del(ctx, worker.AppendClaimKey).Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the status the other disk published mended once the claim is made again", func() bool { return !status() })
	if log := workerLog(t, w); !strings.Contains(log, "claimed again") {
		t.Errorf("the worker's log does not say its claim was made again:\n%s", log)
	}
}
