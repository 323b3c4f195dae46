package main

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/worker"
)

// WORKERS says the build each worker runs, and marks, to upgrade, one of
// another build than sched's and one that publishes none (a kiln older
// than this): after an upgrade, a worker left on the old build queues work
// the upgraded workers refuse as an older kiln's, and nothing said which
// worker that was. A `sched worker` of this build, a worker of another
// build (this process's, given that build), then an old kiln's worker (an
// asynq server of this process that publishes nothing) serve beside it.
func TestWorkersSayTheirBuildAndTheOtherBuildsToUpgrade(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	ctx := context.Background()
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// The build a worker publishes is what `sched version` prints.
	mine := worker.ThisBuild()
	if out, errOut, code := sched(t, env, "version"); code != 0 || out != "sched "+mine.String()+"\n" {
		t.Fatalf("sched version: exit %d, %q%s; want the build workers publish, %q", code, out, errOut, mine)
	}
	child := startWorker(t, env, "--queues", "ingest=1")
	childLine := regexp.QuoteMeta(host+":"+strconv.Itoa(child.Process.Pid)) + `  ingest=1  0 running  up \S+  ` + regexp.QuoteMeta(mine.Short()) + `\n`
	here := regexp.QuoteMeta(host + ":" + strconv.Itoa(os.Getpid()))
	upgrade := "this sched is " + mine.Short() + `: workers of other task formats refuse each other's tasks; bring them to one build (docs/operations.md, "Upgrading kiln with work queued")`

	// Another build: its version, its commit, and one payload version.
	other := worker.ThisBuild()
	other.Version, other.Commit = "v0.0.9", "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"
	other.Payloads[scheduler.KindIngestShard]--
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	// It serves the ingest queue, where no task is queued.
	idle := worker.HandlerFunc(func(context.Context, scheduler.TokenizerSample) error { return nil })
	w, err := worker.New(worker.Params{Redis: opt, Queues: map[string]int{scheduler.QueueIngest: 1}, Handlers: worker.Handlers{Extra: []worker.Handler{idle}}, Build: other})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	stop := sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() { stop() })

	otherLine := here + `  ingest=1  0 running  up \S+  ` + regexp.QuoteMeta(fmt.Sprintf("upgrade it, other task formats: v0.0.9 (commit 9f8e7d6c5b4a) (%s v%d, here v%d)",
		scheduler.KindIngestShard, other.Payloads[scheduler.KindIngestShard], mine.Payloads[scheduler.KindIngestShard])) + `\n`
	out := waitOutput(t, env, regexp.MustCompile(`\nWORKERS\n(`+childLine+otherLine+`|`+otherLine+childLine+`)`), time.Minute, "status")
	if !strings.Contains(out, "\n"+upgrade+"\n") {
		t.Errorf("status with a worker of another build:\n%s\nwant the line %q", out, upgrade)
	}

	// Stopped cleanly, its build goes with it.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	if n := rdb.Exists(ctx, worker.BuildKey(host+":"+strconv.Itoa(os.Getpid()))).Val(); n != 0 {
		t.Errorf("the build of a worker that stopped is still in Redis")
	}
	out, errOut, code := sched(t, env, "status")
	if code != 0 || !regexp.MustCompile(`\nWORKERS\n`+childLine+`append is|\nWORKERS\n`+childLine+`\n`).MatchString(out) || strings.Contains(out, upgrade) {
		t.Errorf("status: exit %d\n%s%s\nwant this build's worker alone, not marked", code, out, errOut)
	}

	// An old kiln's worker: an asynq server that publishes no build.
	old := asynq.NewServer(opt, asynq.Config{Queues: map[string]int{scheduler.QueueIngest: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	if err := old.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	defer old.Shutdown()
	// Read once Redis has run for worker.BuildsSettle: before that, a
	// build missing may be one whose write has not come yet.
	oldLine := here + `  ingest=1  0 running  up \S+  ` + regexp.QuoteMeta("upgrade it: it publishes no build, a kiln older than this sched") + `\n`
	out = waitOutput(t, env, regexp.MustCompile(`\nWORKERS\n(`+childLine+oldLine+`|`+oldLine+childLine+`)`), time.Minute, "status")
	if !strings.Contains(out, "\n"+upgrade+"\n") {
		t.Errorf("status with an old kiln's worker:\n%s\nwant the line %q", out, upgrade)
	}
}

// A worker's build is named, and marked to upgrade where its task formats
// (payload versions) differ from this sched's, with the kinds that do: as
// the newer where those are all newer (this sched and the workers of its
// build are then the older), and as unknown where it publishes none,
// unmarked while Redis is full and refuses its writes. Another version or
// commit of the same formats is not marked: compose's images, built
// without their commit, beside a sched built from the same checkout, were
// all marked to upgrade.
func TestBuildSays(t *testing.T) {
	mine := worker.Build{Version: "v0.2.0", Commit: "1a2b3c4d5e6f708192a3b4c5d6e7f80912345678", Go: "go1.26.0",
		Payloads: map[string]int{"ingest:shard": 3, "ingest:append": 3, "train:segment": 1}}
	with := func(version string, payloads map[string]int) worker.Build {
		b := mine
		b.Version, b.Payloads = version, payloads
		return b
	}
	for _, c := range []struct {
		b         worker.Build
		ok, full  bool
		up        time.Duration
		said      string
		upgrading bool
	}{
		{mine, true, false, -1, "v0.2.0 (commit 1a2b3c4d5e6f)", false},
		{with("v0.2.1", mine.Payloads), true, false, -1, "v0.2.1 (commit 1a2b3c4d5e6f)", false},
		{worker.Build{Version: "dev", Commit: "unknown", Go: "go1.26.0", Payloads: mine.Payloads}, true, false, -1, "dev (commit unknown)", false},
		{with("v0.1.0", map[string]int{"ingest:shard": 2, "ingest:append": 2, "train:segment": 1}), true, false, -1,
			"upgrade it, other task formats: v0.1.0 (commit 1a2b3c4d5e6f) (ingest:append v2, here v3; ingest:shard v2, here v3)", true},
		{with("v0.3.0", map[string]int{"ingest:shard": 4, "train:segment": 1, "bench:new": 1}), true, false, -1,
			"newer task formats, upgrade this sched and the workers of its build: v0.3.0 (commit 1a2b3c4d5e6f) (ingest:shard v4, here v3)", true},
		{with("v0.3.0", map[string]int{"ingest:shard": 4, "ingest:append": 2}), true, false, -1,
			"upgrade it, other task formats: v0.3.0 (commit 1a2b3c4d5e6f) (ingest:append v2, here v3; ingest:shard v4, here v3)", true},
		// Another build's formats are marked whatever Redis's uptime.
		{with("v0.1.0", map[string]int{"ingest:shard": 2}), true, false, time.Second,
			"upgrade it, other task formats: v0.1.0 (commit 1a2b3c4d5e6f) (ingest:shard v2, here v3)", true},
		{worker.Build{}, false, false, -1, "upgrade it: it publishes no build, a kiln older than this sched", true},
		{worker.Build{}, false, false, worker.BuildsSettle, "upgrade it: it publishes no build, a kiln older than this sched", true},
		{worker.Build{}, false, true, -1, "build unknown", false},
		// Redis started since the worker's last write.
		{worker.Build{}, false, false, 0, "build not published yet (Redis started 0s ago)", false},
		{worker.Build{}, false, false, worker.BuildsSettle - time.Second, "build not published yet (Redis started 9s ago)", false},
	} {
		said, upgrading := buildSays(c.b, c.ok, mine, c.full, c.up)
		if said != c.said || upgrading != c.upgrading {
			t.Errorf("build %+v (published %v, Redis full %v, up %s): %q, marked %v; want %q, marked %v", c.b, c.ok, c.full, c.up, said, upgrading, c.said, c.upgrading)
		}
		// What to do first: --watch cuts a line at the terminal's width,
		// and a worker's name, queues and uptime come before it.
		if i := strings.Index(said, "upgrade"); upgrading && (i < 0 || i > 25) {
			t.Errorf("%q: a marked build says what to do at character %d; want it within the first 25", said, i)
		}
	}
}

// A worker listed without a build is marked as a kiln older than this
// only once Redis has run for worker.BuildsSettle: a Redis that comes back
// empty holds no build until each worker's next write, and asynq's
// heartbeat lists a worker again on a timer of its own, so status read
// between the two said to upgrade a worker of this build. Redis is
// restarted empty under a `sched worker` of this build, and an old kiln's
// worker (an asynq server that publishes no build) joins it; status is
// read, with Redis's uptime before and after each read, until the old
// one is marked: the worker of this build never is, and the old one reads
// "not published yet" where the read began within BuildsSettle of
// Redis's start, marked where it began after.
func TestAWorkerIsMarkedOlderOnlyOnceRedisHasHadItsBuild(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	mine := worker.ThisBuild().Short()
	child := startWorker(t, env, "--queues", "ingest=1")
	name := host + ":" + strconv.Itoa(child.Process.Pid)
	waitOutput(t, env, regexp.MustCompile(`\nWORKERS\n`+regexp.QuoteMeta(name)+`  ingest=1  0 running  up \S+  `+regexp.QuoteMeta(mine)+`\n`), time.Minute, "status")

	r.Stop()
	r.StartEmpty()
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	old := asynq.NewServer(opt, asynq.Config{Queues: map[string]int{scheduler.QueueIngest: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	if err := old.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	defer old.Shutdown()
	oldName := host + ":" + strconv.Itoa(os.Getpid())
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	uptime := func() time.Duration {
		t.Helper()
		up, err := worker.RedisUptime(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return up
	}
	const marked = "upgrade it: it publishes no build, a kiln older than this sched"
	deadline := time.Now().Add(2 * time.Minute)
	for youngSeen := false; ; {
		before := uptime()
		out, errOut, code := sched(t, env, "status")
		after := uptime()
		childLine, oldLine := lineOf(out, name+"  "), lineOf(out, oldName+"  ")
		if code != 0 || strings.Contains(childLine, "upgrade") {
			t.Fatalf("status as Redis came back empty: exit %d\n%s%s\nwant this build's worker not marked", code, out, errOut)
		}
		if childLine != "" && !strings.HasSuffix(childLine, "  "+mine) && !strings.Contains(childLine, "  build not published yet (Redis started ") {
			t.Fatalf("status as Redis came back empty:\n%s\nwant this build's worker with its build, or its build not yet published", out)
		}
		switch {
		case oldLine == "":
		case after < worker.BuildsSettle && !strings.Contains(oldLine, "  build not published yet (Redis started "):
			t.Fatalf("status read within %s of Redis's start:\n%s\nwant the worker without a build not yet marked", after, out)
		case before >= worker.BuildsSettle && !strings.HasSuffix(oldLine, "  "+marked):
			t.Fatalf("status read %s after Redis's start:\n%s\nwant the worker without a build marked", before, out)
		case after < worker.BuildsSettle:
			youngSeen = true
		case before >= worker.BuildsSettle && strings.HasSuffix(childLine, "  "+mine):
			if !youngSeen {
				t.Logf("no status was read within %s of Redis's start: only the mark once it has run that long is checked", worker.BuildsSettle)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after Redis came back empty, the worker of this build is not listed with it, or the old one not marked; last status:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
