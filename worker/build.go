package worker

import (
	"context"
	"fmt"
	"maps"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/lapse"
	"github.com/kiln-lm/kiln/scheduler"
)

// A worker publishes the build it runs in Redis, beside asynq's heartbeat,
// for `sched status` to name the worker of another build. After an
// upgrade, a worker left on the old build goes on queueing work at its own
// payload versions (an ingest's shards queue their appends, a segment the
// next one), which the upgraded workers refuse as an older kiln's; nothing
// else says which worker that is.

// BuildKey is the Redis hash in which the worker process name, host:pid as
// asynq's heartbeat names it (scheduler.WorkerProcess.Name), publishes its
// build: its version, commit and Go version, and its payload versions.
func BuildKey(name string) string { return "kiln:worker:" + name + ":build" }

// BuildEvery is how often a worker writes its build again: more often
// than asynq writes its heartbeat (every 5 s), so that a Redis that comes
// back empty has a worker's build again before asynq lists the worker
// again. BuildTTL is how long the key outlives the last write: many
// writes, so that a Redis that stalls for a few seconds does not show a
// live worker as one that publishes no build (a kiln older than this),
// while a worker that died is dropped from the list by asynq 10 s after
// its last heartbeat whatever its key says.
const (
	BuildEvery = time.Second
	BuildTTL   = 30 * time.Second
)

// BuildsSettle is how long after Redis starts a worker that runs may
// still lack its build's key: a Redis restarted empty (or with its keys
// lapsed while it was down) holds no build until each worker's next write,
// due within BuildEvery; BuildsSettle allows ten, for a worker on a busy
// machine or a Redis still loading.
const BuildsSettle = 10 * BuildEvery

// RedisUptime is how long Redis has run (INFO server's uptime_in_seconds):
// within BuildsSettle of its start, a worker listed without a build may be
// one whose write has not come yet, not a kiln older than this.
func RedisUptime(ctx context.Context, rdb redis.Cmdable) (time.Duration, error) {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return 0, fmt.Errorf("read Redis's INFO server: %w", err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("Redis's INFO server: uptime_in_seconds is %q, not a number of seconds", v)
			}
			return time.Duration(n) * time.Second, nil
		}
	}
	return 0, fmt.Errorf("Redis's INFO server has no uptime_in_seconds")
}

// Version is the version of the sched program this package is built into,
// as `sched version` prints it: sched's own (set at build time with
// -ldflags "-X main.version=v0.1.0"), which sched hands this package as it
// starts; "dev" where none was set.
var Version = "dev"

// Build is the build a worker runs, as `sched version` prints it, and the
// payload versions it reads and writes.
type Build struct {
	// Version is the version set at build time (Version); Commit the VCS
	// revision Go stamped into the program ("unknown" where it stamped
	// none: a build outside a checkout, a test); Go the Go version it was
	// built with.
	Version, Commit, Go string
	// Payloads maps each task kind the build knows to the payload version
	// it reads and writes (scheduler.Policy.Version). Every kind, not only
	// those the worker serves: a worker queues kinds it does not serve (an
	// ingest's shards queue its appends).
	Payloads map[string]int
}

// ThisBuild is the build of this program.
func ThisBuild() Build {
	b := Build{Version: Version, Commit: "unknown", Go: "unknown", Payloads: map[string]int{}}
	// What `sched version` reads, the same way.
	if bi, ok := debug.ReadBuildInfo(); ok {
		b.Go = bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				b.Commit = s.Value
			}
		}
	}
	for _, k := range scheduler.Kinds() {
		if p, ok := scheduler.PolicyFor(k); ok {
			b.Payloads[k] = p.Version
		}
	}
	return b
}

// String is the build as `sched version` prints it after "sched ":
// "v0.1.0 (commit 1a2b3c..., go1.26.0)".
func (b Build) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", b.Version, b.Commit, b.Go)
}

// Short is the build in few words, for a line that says more: its version
// and its commit's first 12 digits, which name a commit as git's short
// hashes do.
func (b Build) Short() string {
	c := b.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	return fmt.Sprintf("%s (commit %s)", b.Version, c)
}

// Same reports whether b and o are one build: the same version and
// commit, and the same payload version of every kind both know. Two
// builds made outside a checkout both read "dev (commit unknown)"; their
// payload versions still tell them apart where that matters.
func (b Build) Same(o Build) bool {
	return b.Version == o.Version && b.Commit == o.Commit && len(b.OtherPayloads(o)) == 0
}

// OtherPayloads are the kinds, sorted, that b reads and writes at another
// payload version than o: the tasks of those kinds that either queues,
// the other's workers refuse.
func (b Build) OtherPayloads(o Build) []string {
	var kinds []string
	for k, v := range b.Payloads {
		if ov, ok := o.Payloads[k]; ok && ov != v {
			kinds = append(kinds, k)
		}
	}
	slices.Sort(kinds)
	return kinds
}

// fields are b as the fields of its hash at BuildKey.
func (b Build) fields() map[string]any {
	var ps []string
	for _, k := range slices.Sorted(maps.Keys(b.Payloads)) {
		ps = append(ps, k+"="+strconv.Itoa(b.Payloads[k]))
	}
	return map[string]any{"version": b.Version, "commit": b.Commit, "go": b.Go, "payloads": strings.Join(ps, ",")}
}

// parseBuild reads a build's hash.
func parseBuild(h map[string]string) Build {
	b := Build{Version: h["version"], Commit: h["commit"], Go: h["go"], Payloads: map[string]int{}}
	for _, p := range strings.Split(h["payloads"], ",") {
		k, v, ok := strings.Cut(p, "=")
		if n, err := strconv.Atoi(v); ok && err == nil {
			b.Payloads[k] = n
		}
	}
	return b
}

// ReadBuilds returns the build each of the worker processes names
// publishes, by name, in one round trip; a worker that publishes none (a
// kiln older than this one) is absent from it.
func ReadBuilds(ctx context.Context, rdb redis.UniversalClient, names []string) (map[string]Build, error) {
	if len(names) == 0 {
		return nil, nil
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(names))
	for i, n := range names {
		cmds[i] = pipe.HGetAll(ctx, BuildKey(n))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("read the workers' builds: %w", err)
	}
	out := map[string]Build{}
	for i, n := range names {
		if h := cmds[i].Val(); len(h) > 0 {
			out[n] = parseBuild(h)
		}
	}
	return out, nil
}

// processName is this process as asynq's heartbeat names it: host:pid.
func processName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown-host" // asynq's
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// publishBuild writes the worker's build at its key, with its TTL, in one
// transaction: the key never stands without its TTL.
func (w *Worker) publishBuild(ctx context.Context) error {
	key := BuildKey(w.procName)
	_, err := w.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, key, w.p.Build.fields())
		p.PExpire(ctx, key, BuildTTL)
		return nil
	})
	return err
}

// buildWriteTimeout bounds one write of the build: longer than
// BuildEvery, for a Redis that answers slowly (the ticker skips the ticks
// a write outlasts).
const buildWriteTimeout = 5 * time.Second

// keepBuild publishes the worker's build now and every BuildEvery until
// the returned function is called, which then deletes it: a worker that
// stops cleanly leaves no key behind. A write that fails (Redis does not
// answer, or is full) is tried again at the next tick; the log says when
// the writes begin to fail, and when they succeed again.
func (w *Worker) keepBuild() (stop func()) {
	log := w.p.Logger.With(zap.String("key", BuildKey(w.procName)))
	var failures lapse.Lapse
	write := func() {
		ctx, cancel := context.WithTimeout(context.Background(), buildWriteTimeout)
		err := w.publishBuild(ctx)
		cancel()
		switch first, back := failures.Note(err); {
		case first:
			log.Warn(fmt.Sprintf("this worker's build is not published in Redis: sched status shows it as a worker that publishes none (a kiln older than this) once the last write lapses; tried again every %s", BuildEvery),
				zap.Error(err))
		case back > 0:
			log.Info("this worker's build is published in Redis again", zap.Int("writes_failed", back))
		}
	}
	write()
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(BuildEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				write()
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := w.rdb.Del(ctx, BuildKey(w.procName)).Err(); err != nil {
			log.Warn(fmt.Sprintf("this worker's build was not deleted from Redis as it stopped: it lapses within %s", BuildTTL), zap.Error(err))
		}
	}
}
