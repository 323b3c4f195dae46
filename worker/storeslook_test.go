package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// A plan that a worker without the token stores runs (compose's
// worker-ingest) asks the worker that holds them to look at its disk
// before it reads their statuses: a store deleted from that disk just
// before the plan is ingested whole again, though the holding worker's
// own looks are an hour apart. Without the question the plan read the
// status of the deleted store, took every file for stored and queued
// nothing.
func TestAPlanOnAnotherWorkerAsksTheStoresWorkerToLookFirst(t *testing.T) {
	e := newIngestEnv(t)
	root, storesDir := t.TempDir(), t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// The worker that appends: it holds the stores and watches them.
	e.configureLocal(t.TempDir(), storesDir, root)
	holder := e.handlers.Ingest
	holder.Redis = e.rdb
	holder.Stores = holder.Pipeline.WatchStores()
	watching := make(chan struct{})
	go func() { defer close(watching); holder.WatchStores(ctx, time.Hour, zap.NewNop()) }()
	t.Cleanup(func() { cancel(); <-watching })
	e.serve(map[string]int{scheduler.QueueAppend: 1})
	// The worker that plans and tokenizes, on another disk.
	e.configureLocal(t.TempDir(), "", root)
	e.handlers.Ingest.Redis = e.rdb
	e.serve(map[string]int{scheduler.QueueIngest: 2})
	waitTill(t, "the holding worker to say it watches its stores", func() bool {
		return e.rdb.Exists(context.Background(), StoresWatchedKey).Val() == 1
	})

	var want []string
	for f := range 2 {
		var b strings.Builder
		for d := range 3 {
			s := fmt.Sprintf("file %d doc %d: the quick brown fox", f, d)
			fmt.Fprintf(&b, `{"text":%q}`+"\n", s)
			want = append(want, s)
		}
		if err := os.WriteFile(filepath.Join(root, fmt.Sprintf("f%d.jsonl", f)), []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(want)
	dir := filepath.Join(storesDir, "kept")
	ingestAll := func(when string) {
		t.Helper()
		sub, err := e.c.Again(ctx, scheduler.IngestPlan{Dataset: "local:" + filepath.Join(root, "*.jsonl"), Store: "kept", Tokenizer: ingestTokenizer})
		if err != nil {
			t.Fatal(err)
		}
		ts := e.waitFor(sub.Info.ID, time.Minute, "completed", state("completed"))
		e.waitDrained(time.Minute)
		docs, _ := ingestStoreDocs(t, e.tok, dir)
		slices.Sort(docs)
		if !slices.Equal(docs, want) {
			t.Fatalf("%s: the store holds %d documents %q; want the %d of every file once (the plan said %q)", when, len(docs), docs, len(want), ts.Progress.Message)
		}
	}
	ingestAll("first ingest")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	ingestAll("the store deleted, then its ingest queued again at once")
}

// A plan does not wait for a watching worker that has gone: once the key
// that says it watches lapses, the plan goes on.
func TestAPlanDoesNotWaitForAWatchThatStopped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	// As a watching worker killed after its last look leaves it.
	if err := e.rdb.Set(ctx, StoresWatchedKey, "1", 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	c := &Ingest{Redis: e.rdb}
	done := make(chan error, 1)
	go func() { done <- AskForALook(ctx, c.Redis) }()
	select {
	case err := <-done:
		if !errors.Is(err, errWatchGone) {
			t.Fatalf("a plan whose watching worker stopped: %v; want errWatchGone, which its log says", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("a plan still waits a minute after the watching worker's key was set to lapse in 300 ms")
	}
	if n := e.rdb.Exists(ctx, StoresWatchedKey).Val(); n != 0 {
		t.Fatalf("the plan went on while the watch's key was still there")
	}
}

// A look that lasts longer than the watch's key lives (here object
// storage hung, under the start's mending of the statuses left pending)
// is not taken for a stopped watch: the watch says so again while the
// look runs, and a plan that asked meanwhile waits for the look asked of
// it, where it went on without one once the key lapsed.
func TestALongLookIsNotTakenForAStoppedWatch(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGSTOP of the S3 server is exercised on linux")
	}
	t.Parallel()
	e := newEnv(t)
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	holder := &Ingest{Redis: e.rdb, Pipeline: ingest.Pipeline{Objects: objects, StoresDir: t.TempDir()}}
	holder.Stores = holder.Pipeline.WatchStores()
	holder.Stores.ReconcileLater()
	// Connections are accepted and never answered until SIGCONT.
	resume := srv.Freeze()
	const every = 100 * time.Millisecond
	watching := make(chan struct{})
	go func() { defer close(watching); holder.WatchStores(ctx, every, zap.NewNop()) }()
	t.Cleanup(func() { resume(); cancel(); <-watching })
	waitTill(t, "the watch's first look to begin", func() bool {
		return e.rdb.HGet(context.Background(), StoresLooksKey, "started").Val() != ""
	})

	asked := make(chan error, 1)
	go func() { asked <- AskForALook(ctx, e.rdb) }()
	// The look hangs on object storage past the key's life, at least.
	time.Sleep(2 * watchedFor(every))
	select {
	case err := <-asked:
		t.Fatalf("a plan asked for a look went on (%v) while the look hung and the watch ran", err)
	default:
	}
	resume()
	select {
	case err := <-asked:
		if err != nil {
			t.Fatalf("the plan's look, object storage back: %v; want it answered", err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the plan still waits 3 minutes after object storage answered again")
	}
}
