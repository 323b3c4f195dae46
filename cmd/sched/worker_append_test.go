package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/worker"
)

// The README's CPU-day worker typed on a second machine (another data
// directory; the same Redis and object storage), as a user adding ingest
// capacity would, is refused while the first machine serves append: exit
// 2, one line naming that worker and what to do, and the statuses of the
// first machine's stores left as they were, where its start used to clear
// them. A second worker of the first data directory starts, and so does
// an ingest-only worker of the second. Once every worker of the first
// directory has stopped and their claim has lapsed, the second machine
// may serve append.
func TestASecondDiskIsRefusedTheAppendQueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	s3 := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	ropt, err := redis.ParseURL(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(ropt)
	t.Cleanup(func() { rdb.Close() })
	first, second := filepath.Join(t.TempDir(), "data"), filepath.Join(t.TempDir(), "data")
	makeStore(t, filepath.Join(first, "tokens", "code"), 1000)
	shared := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_S3_ENDPOINT=" + s3.Endpoint, "KILN_S3_ACCESS_KEY=" + s3.AccessKey,
		"KILN_S3_SECRET_KEY=" + s3.SecretKey, "KILN_LOG_FORMAT=json"}
	onFirst := slices.Concat(shared, []string{"KILN_DATA_DIR=" + first})
	onSecond := slices.Concat(shared, []string{"KILN_DATA_DIR=" + second})
	status := func() string {
		t.Helper()
		rc, err := objects.Get(ctx, ingest.StatusKey("code"))
		if err != nil {
			return ""
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	started := func(w *exec.Cmd) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("worker %d to start", w.Process.Pid), func() bool { return strings.Contains(workerLog(t, w), `"msg":"worker started"`) })
	}

	a := startWorker(t, onFirst, "--queues", "ingest=1,append=1")
	// Its start records the store on its disk, which no status named.
	waitUntil(t, "the first worker's start recording store code", func() bool { return status() != "" })
	before := status()

	var cpuDay []string // the README's worker command, as typed there
	for _, line := range readmeDay(t) {
		if words := shellWords(line); len(words) > 2 && words[1] == "worker" {
			cpuDay = slices.DeleteFunc(words[1:], func(w string) bool { return w == "&" })
		}
	}
	if !slices.Contains(cpuDay, "--queues") || !strings.Contains(strings.Join(cpuDay, " "), "append=") {
		t.Fatalf("the README's CPU day starts worker %q; want one that serves the append queue", cpuDay)
	}
	out, errOut, code := sched(t, onSecond, cpuDay...)
	host, _ := os.Hostname()
	want := regexp.MustCompile(`^sched: the append queue is served by the worker on host ` + regexp.QuoteMeta(host) + `, data directory ` + regexp.QuoteMeta(first) +
		fmt.Sprintf(` \(pid %d\), whose disk holds the token stores \(Redis key kiln:append:owner\); `, a.Process.Pid) +
		`this worker's data directory, ` + regexp.QuoteMeta(second) + ` on host ` + regexp.QuoteMeta(host) + `, is another disk: ` +
		regexp.QuoteMeta(`serve append from one machine (the one whose disk holds the token stores, the GPU worker's); start more workers elsewhere with --queues ingest=N; `+
			`if that worker is gone for good, wait for its claim to lapse (30s after it stopped) and start this one again`) + `.*\n$`)
	if code != exitBadInput || !want.MatchString(errOut) || out != "" {
		t.Fatalf("the README's CPU-day worker on a second disk: exit %d, stdout %q, stderr %q; want exit 2 and one line matching %s", code, out, errOut, want)
	}
	if after := status(); after != before {
		t.Fatalf("the refused start changed store code's status in object storage:\nbefore %s\nafter  %s", before, after)
	}
	// sched status names the machine append is served from.
	if out, _, _ := sched(t, onSecond, "status"); !strings.Contains(out, fmt.Sprintf("\nappend is served from host %s, data directory %s (pid %d): the token stores are on its disk\n", host, first, a.Process.Pid)) {
		t.Errorf("sched status does not name the worker append is served from:\n%s", out)
	}

	ingestOnly := startWorker(t, onSecond, "--queues", "ingest=2")
	started(ingestOnly)
	a2 := startWorker(t, onFirst, "--queues", "append=1")
	started(a2)

	for _, w := range []*exec.Cmd{a, a2} {
		if err := w.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	_ = a.Wait()
	_ = a2.Wait()
	firstID, err := worker.DiskID(first)
	if err != nil {
		t.Fatal(err)
	}
	// Stopped workers leave their claim to lapse: another worker of their
	// directory could still be serving append. The test lapses it sooner
	// than its 30 s, as Redis would.
	if disk := rdb.HGet(ctx, worker.AppendClaimKey, "disk").Val(); disk != firstID {
		t.Fatalf("the claim after the first directory's workers stopped names disk %q; want it left to lapse, naming %s", disk, firstID)
	}
	if err := rdb.PExpire(ctx, worker.AppendClaimKey, 1).Err(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the first directory's claim to lapse", func() bool { return rdb.Exists(ctx, worker.AppendClaimKey).Val() == 0 })

	b := startWorker(t, onSecond, cpuDay[1:]...)
	started(b)
	secondID, err := worker.DiskID(second)
	if err != nil {
		t.Fatal(err)
	}
	if disk := rdb.HGet(ctx, worker.AppendClaimKey, "disk").Val(); disk != secondID || secondID == firstID {
		t.Fatalf("the claim names disk %q; want the second directory's, %s (the first's is %s)", disk, secondID, firstID)
	}
}
