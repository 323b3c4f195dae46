package main

import (
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
)

// Redis lost its data while a worker tokenized the first of two files:
// the plan and the other file's task went with it, and the shard, once
// its upload went through, queued its append into the empty Redis. The
// store's line under INGEST read "files 1/1 done ... done", the store
// holding one file of two, and nothing said to queue the ingest again. It
// says that Redis holds no record of the plan, what the store holds by
// its status in object storage, and the command that queues what it lacks;
// that command then queues the other file alone.
func TestStatusIngestWhosePlanRedisLostSaysSo(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	src := sourceDir(t, dir, twoFiles)
	r := testsvc.StartRedis(t)
	srv := testsvc.S3(t)
	faults := srv.Faults(t)
	held := faults.Add(testsvc.Fault{Method: "PUT", Path: "/shards/", Action: testsvc.Hold, Count: 1,
		Release: make(chan struct{}), Held: make(chan struct{})})
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src,
		"KILN_S3_ENDPOINT=" + faults.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey}
	glob := "local:" + filepath.Join(src, "*.jsonl")
	if out, errOut, code := sched(t, env, "enqueue", "ingest", glob, "--store", "code", "--tokenizer", "tk"); code != 0 {
		t.Fatalf("enqueue ingest: exit %d\n%s%s", code, out, errOut)
	}
	startWorker(t, env, "--queues", "ingest=1,append=1")
	<-held.Held

	// Redis restarted without persistence, as far as the queue can tell.
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	close(held.Release)

	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	p := &ingest.Pipeline{Objects: objects}
	var st ingest.StoreStatus
	waitUntil(t, "the held file appended to store code", func() bool {
		st, err = p.Status(ctx, "code")
		return err == nil && len(st.Done) == 1
	})
	// Its append's task completed in Redis too (the status is published
	// before the task ends).
	out := waitOutput(t, env, regexp.MustCompile(`(?m)^code  files 1/1 done`), time.Minute, "status")
	l := lineOf(out, "code  ")
	want := "code  files 1/1 done of those Redis holds  " + formatCount(st.Tokens, "tok") +
		"  Redis holds no record of its plan (it lost its data, or the plan ended more than 7 days ago), so the dataset's file count is unknown: " +
		"the store holds " + formatCount(st.Tokens, "tok") + " of 1 file, by its status in object storage; " +
		"'sched enqueue ingest <dataset> --store code' with the ingest's arguments queues the files the store lacks, none twice"
	if l != want {
		t.Fatalf("status after Redis lost the ingest's plan:\n%s\nwant the line\n%s", out, want)
	}

	out, errOut, code := sched(t, env, "enqueue", "ingest", glob, "--store", "code", "--tokenizer", "tk")
	if code != 0 {
		t.Fatalf("enqueue ingest again: exit %d\n%s%s", code, out, errOut)
	}
	waitOutput(t, env, regexp.MustCompile(`(?m)^code \(.*\)  files 2/2 done  .*  done$`), time.Minute, "status")
	if st, err = p.Status(ctx, "code"); err != nil || len(st.Done) != 2 {
		t.Fatalf("store code after the ingest queued again: %+v, %v; want both files", st, err)
	}
	out, _, _ = sched(t, env, "status")
	if strings.Contains(out, "no record of its plan") {
		t.Errorf("status once the ingest is queued again:\n%s\nwant no word of a lost plan", out)
	}
}
