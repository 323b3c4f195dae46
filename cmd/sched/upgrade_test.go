package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// operations.md's upgrade with work queued: a task an older kiln queued
// (a payload of the version before, written into Redis as that build
// wrote it) is archived by this build's worker at once, and `sched runs`
// says why and what to do; the command that queued it queues the work
// again at this build's version, and the worker does it.
func TestWorkAnOlderKilnQueuedIsArchivedAndQueuedAgainByItsCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	src := sourceDir(t, dir, map[string]string{"a.jsonl": `{"text":"package main\nfunc f() {}\n"}` + "\n"})
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src}
	glob := "local:" + filepath.Join(src, "*.jsonl")

	p, _ := scheduler.PolicyFor(scheduler.KindIngestPlan)
	old := fmt.Sprintf(`{"v":%d,"args":{"dataset":%q,"store":"code","tokenizer":"tk"}}`, p.Version-1, glob)
	c := asynq.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	defer c.Close()
	info, err := c.Enqueue(asynq.NewTask(scheduler.KindIngestPlan, []byte(old)), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(p.MaxRetry+1))
	if err != nil {
		t.Fatal(err)
	}
	startWorker(t, env, "--queues", "ingest=1,append=1")
	want := fmt.Sprintf("%s  archived  failed for good after 1 attempt: task %s: payload version %d is not read by this build (it reads %d): "+
		"an older kiln queued it; upgrade the workers sched status marks, then sched enqueue the work again (not sched retry)",
		info.ID, scheduler.KindIngestPlan, p.Version-1, p.Version)
	waitOutput(t, env, regexp.MustCompile(regexp.QuoteMeta(want)), time.Minute, "runs")

	// A retry would queue the same payload, which the worker refuses at
	// once: it is refused here, saying what queues the work. It said it
	// queued the task again, exit 0.
	out, errOut, code := sched(t, env, "retry", info.ID)
	if code != 2 || !strings.Contains(errOut, fmt.Sprintf("task %s was queued by an older kiln (payload version %d; this build reads version %d)", info.ID, p.Version-1, p.Version)) ||
		!strings.Contains(errOut, "enqueue the work again with the sched enqueue command that queued it") || strings.Contains(out, "queued") {
		t.Fatalf("sched retry of the older kiln's task: exit %d\n%s%s", code, out, errOut)
	}

	out, errOut, code = sched(t, env, "ingest", glob, "--store", "code", "--tokenizer", "tk")
	if code != 0 || !strings.Contains(out, "queued ingest:plan:") {
		t.Fatalf("the same ingest again: exit %d\n%s%s", code, out, errOut)
	}
	waitOutput(t, env, regexp.MustCompile(`(?m)^code \(.*\)  files 1/1 done  .*  done$`), time.Minute, "status")
}
