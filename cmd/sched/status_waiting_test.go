package main

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// An ingest's task that meets an object store out of service (every shard
// upload answered 503 SlowDown) waits for it, using none of its retries,
// and `sched status` lists it under WAITING as operations.md says: waiting
// for the object store at <url> to answer (<what failed>), as of its last
// try, with its time and that of its next look. It was in asynq's retry
// state, which status listed nowhere but in the RETRY count: neither
// running nor failed, only `sched runs` showed it.
func TestStatusListsATaskWaitingOutAnObjectStoreOutage(t *testing.T) {
	t.Parallel()
	env, faults := ingestIntoAStoreAnswering503(t)

	stamp := `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	line := regexp.MustCompile(`(?m)^ingest:shard:\S+  waiting  local:\S+ \S+/[ab]\.jsonl into code  waiting for the object store at ` +
		regexp.QuoteMeta("http://"+faults.Endpoint+"/kiln") + ` to answer \(put: 503 SlowDown: injected by the test\)  ` +
		`as of its last try at ` + stamp + `; it looks again at ` + stamp + `$`)
	out := waitOutput(t, env, line, 2*time.Minute, "status")
	if !strings.Contains(out, "\nWAITING (no retry used)\ningest:shard:") {
		t.Errorf("status:\n%s\nwant the waiting task under WAITING", out)
	}
	if !strings.Contains(out, "FAILURES in the last hour\nnone\n") {
		t.Errorf("status:\n%s\nwant no failure: the task waits, using no retry", out)
	}
}

// `sched status <task-id>` of a task that waits out an object store
// outage says it waits, and what for, as WAITING does: it said asynq's
// state, "retry", the word of a failed attempt tried again, where no
// attempt failed. Once the store answers an error that is no outage
// (400), the attempt failed, and the task reads "retry" with that error.
func TestStatusOfATaskWaitingOutAnOutageSaysItWaits(t *testing.T) {
	t.Parallel()
	env, faults := ingestIntoAStoreAnswering503(t)

	listed := regexp.MustCompile(`(?m)^(ingest:shard:\S+)  waiting  `)
	id := listed.FindStringSubmatch(waitOutput(t, env, listed, 2*time.Minute, "status"))[1]
	stamp := `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	want := regexp.MustCompile(`^` + regexp.QuoteMeta(id) + `  waiting  .*"waiting for the object store at ` +
		regexp.QuoteMeta("http://"+faults.Endpoint+"/kiln") + ` to answer \(put: 503 SlowDown: injected by the test\)"  ` +
		`as of its last try at ` + stamp + `; it looks again at ` + stamp + `\n$`)
	if out, errOut, code := sched(t, env, "status", id); code != 0 || !want.MatchString(out) || strings.Contains(out, "retry") || strings.Contains(out, "last error") {
		t.Errorf("status %s: exit %d %q %q\nwant it waiting for the object store, as WAITING lists it, no retry nor error", id, code, out, errOut)
	}

	// The store answers again, refusing the upload: a failure, retried.
	faults.Clear()
	faults.Add(testsvc.Fault{Method: "PUT", Path: "/shards/", Action: testsvc.Status, Code: http.StatusBadRequest})
	// Now, not at the wait's next look.
	out, errOut, code := sched(t, env, "retry", id)
	if code != 0 {
		t.Fatalf("retry %s: exit %d\n%s%s", id, code, out, errOut)
	}
	// It says the task waited, as status does, not that an attempt failed.
	if now := id + " was waiting (no retry used)"; !strings.HasPrefix(out, now) || !strings.Contains(out, "; running it now") {
		t.Errorf("retry %s of a waiting task said %q; want %q ... running it now", id, out, now)
	}
	failed := waitStatus(t, env, id, regexp.MustCompile(`^`+regexp.QuoteMeta(id)+`  retry  .*last error: .*400 InternalError: injected by the test`), 2*time.Minute)
	if strings.Contains(failed, "waiting") {
		t.Errorf("status %s after a failed attempt: %q; want it no longer waiting", id, failed)
	}
}

// ingestIntoAStoreAnswering503 queues the ingest of two files into store
// code, with a worker of ingest and append, through a proxy that answers
// every shard upload 503 SlowDown: each shard task waits out the store.
func ingestIntoAStoreAnswering503(t *testing.T) (env []string, faults *testsvc.S3Faults) {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "kiln")
	tokenizerTK(t, dir, data)
	src := sourceDir(t, dir, twoFiles)
	r := testsvc.StartRedis(t)
	srv := testsvc.S3(t)
	faults = srv.Faults(t)
	faults.Add(testsvc.Fault{Method: "PUT", Path: "/shards/", Action: testsvc.Status, Code: http.StatusServiceUnavailable})
	env = []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src,
		"KILN_S3_ENDPOINT=" + faults.Endpoint, "KILN_S3_ACCESS_KEY=" + srv.AccessKey, "KILN_S3_SECRET_KEY=" + srv.SecretKey}
	if out, errOut, code := sched(t, env, "enqueue", "ingest", "local:"+filepath.Join(src, "*.jsonl"), "--store", "code", "--tokenizer", "tk"); code != 0 {
		t.Fatalf("enqueue ingest: exit %d\n%s%s", code, out, errOut)
	}
	startWorker(t, env, "--queues", "ingest=1,append=1")
	return env, faults
}
