package scheduler

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/tokens"
)

// BenchmarkSnapshotOfALargeIngest reads a Snapshot, and a Snapshot with
// its Datasets, of a Redis holding what a large ingest leaves there for
// its kinds' retention (7 days): tasks completed, half of them
// ingest:shard and half ingest:append, each with its last progress
// record. `sched status`, `sched runs` and every metrics scrape read one.
//
//	go test -run '^$' -bench SnapshotOfALargeIngest -benchtime 3x -benchmem ./scheduler
func BenchmarkSnapshotOfALargeIngest(b *testing.B) {
	for _, n := range []int{5000, 20000} {
		b.Run("tasks="+strconv.Itoa(n), func(b *testing.B) {
			c, redis := ingestKept(b, n)
			ctx := context.Background()
			b.Run("Snapshot", func(b *testing.B) {
				b.ReportAllocs()
				defer redisCost(b, c, redis)()
				for b.Loop() {
					s, err := c.Snapshot(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if len(s.Tasks) != n {
						b.Fatalf("snapshot holds %d tasks; want %d", len(s.Tasks), n)
					}
				}
			})
			b.Run("Snapshot+Datasets", func(b *testing.B) {
				b.ReportAllocs()
				defer redisCost(b, c, redis)()
				for b.Loop() {
					s, err := c.Snapshot(ctx)
					if err != nil {
						b.Fatal(err)
					}
					ds := s.Datasets()
					if len(ds) != 1 || ds[0].Files != n/2 || ds[0].Done != n/2 {
						b.Fatalf("datasets %+v; want one store of %d files, all done", ds, n/2)
					}
				}
			})
		})
	}
}

// ingestKept is a Client of a fresh Redis holding n completed ingest tasks
// of one store, left as workers leave them: n/2 ingest:shard tasks
// enqueued, an asynq server running them, each queuing its file's
// ingest:append, every task writing its progress as it starts and its
// final record as it ends, with its kind's retention.
func ingestKept(b *testing.B, n int) (*Client, *testsvc.RedisServer) {
	b.Helper()
	r := testsvc.StartRedis(b)
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		b.Fatal(err)
	}
	c := NewClient(opt)
	b.Cleanup(func() { c.Close() })
	ctx := context.Background()

	const (
		repo      = "bigcode/the-stack-v2-dedup"
		store     = "the-stack-v2-dedup"
		revision  = "92c3d5b2c5f3f1e8d1b6ac3b8e2f4d7a9c0e1f23"
		tokenizer = "kiln-32k"
	)
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	shards := make([]Args, n/2)
	for i := range shards {
		path := fmt.Sprintf("data/Python/train-%05d-of-%05d.parquet", i, len(shards))
		shards[i] = IngestShard{Dataset: store, Repo: repo, Revision: revision, Path: path, Size: 180<<20 + int64(i)*4096,
			SHA256: hash(path), Columns: ingest.Columns{Blob: "blob_id", Encoding: "src_encoding"}, Store: store,
			Tokenizer: tokenizer, ShardID: repo + "/" + path}
	}
	appendOf := func(a IngestShard) IngestAppend {
		return IngestAppend{Store: a.Store, ShardID: a.ShardID, Object: ingest.ShardObject(a.Store, a.ShardID), Dataset: a.Dataset,
			Source: a.Repo + "/" + a.Path, Revision: a.Revision, SHA256: hash(a.ShardID), Documents: 41_207, Tokens: 97_531_246,
			Tokenizer: tokens.Tokenizer{Name: tokenizer, SHA256: hash(tokenizer), VocabSize: 32768, EOS: 0},
			Skipped:   ingest.Skips{"binary": 12, "too_long": 3},
			Layout:    &ingest.Layout{Skips: []ingest.SkipRun{{At: 311, N: 2, Reason: "binary"}, {At: 9_012, N: 10, Reason: "binary"}, {At: 30_550, N: 3, Reason: "too_long"}}}}
	}

	// What a worker writes of a task (worker.Reporter): "running" as it
	// starts, then its final record, kept for the kind's retention.
	host, _ := os.Hostname()
	worker := host + ":" + strconv.Itoa(os.Getpid())
	var ended atomic.Int64
	done := make(chan struct{})
	handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		p, _ := PolicyFor(t.Type())
		start := time.Now()
		pr := Progress{TaskID: id, Kind: t.Type(), Fraction: -1, State: "running", Worker: worker, Started: start, Updated: start}
		if err := WriteProgress(ctx, c.rdb, pr, p.Retention); err != nil {
			return err
		}
		switch t.Type() {
		case KindIngestShard:
			a, err := Decode[IngestShard](t.Payload())
			if err != nil {
				return err
			}
			ap := appendOf(a)
			if _, err := c.Enqueue(ctx, ap); err != nil {
				return err
			}
			pr.Message = fmt.Sprintf("%s: %d documents, %d tokens, skipped documents: %s", a.Path, ap.Documents, ap.Tokens, ap.Skipped)
		case KindIngestAppend:
			a, err := Decode[IngestAppend](t.Payload())
			if err != nil {
				return err
			}
			pr.Rate, pr.Unit = 412_345_678, "B"
			pr.Message = fmt.Sprintf("appended %s to store %s: %d tokens, the store holds %d", a.Source, a.Store, a.Tokens, 1_000*a.Tokens)
		}
		pr.State, pr.Fraction, pr.Updated = "done", 1, time.Now()
		if err := WriteProgress(ctx, c.rdb, pr, p.Retention); err != nil {
			return err
		}
		if ended.Add(1) == int64(n) {
			close(done)
		}
		return nil
	})
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 16, Queues: map[string]int{QueueIngest: 1, QueueAppend: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.ErrorLevel})
	if err := srv.Start(handler); err != nil {
		b.Fatal(err)
	}
	if res, err := c.EnqueueMany(ctx, shards, 16); err != nil || res.Enqueued != len(shards) {
		b.Fatalf("enqueue %d shards: %+v, %v", len(shards), res, err)
	}
	<-done
	// Shutdown waits for the handlers' tasks to be marked completed.
	srv.Shutdown()
	for q, want := range map[string]int{QueueIngest: n / 2, QueueAppend: n / 2} {
		info, err := c.insp.GetQueueInfo(q)
		if err != nil || info.Completed != want {
			b.Fatalf("queue %s: %+v, %v; want %d completed", q, info, err, want)
		}
	}
	return c, r
}

// redisCost, deferred at a benchmark's start, reports what its loop cost
// Redis: the bytes Redis sent (its total_net_output_bytes, which counts
// every client's replies: the benchmark's alone here) and the CPU time of
// the redis-server process, each per op.
func redisCost(b *testing.B, c *Client, r *testsvc.RedisServer) func() {
	sent := func() float64 {
		info, err := c.rdb.Info(context.Background(), "stats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_net_output_bytes:"); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				return n
			}
		}
		b.Fatal("INFO stats has no total_net_output_bytes")
		return 0
	}
	sent0, cpu0 := sent(), procCPU(r.Pid())
	return func() {
		b.ReportMetric((sent()-sent0)/float64(b.N), "redis-sent-B/op")
		b.ReportMetric((procCPU(r.Pid())-cpu0)*1e3/float64(b.N), "redis-cpu-ms/op")
	}
}

// procCPU is a process's user and system CPU seconds, from
// /proc/<pid>/stat (in clock ticks of 1/100 s), or 0.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return float64(utime+stime) / 100
}
