package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// waitOutput runs sched with args until its output matches re; the
// commands' own work is the event waited on.
func waitOutput(t *testing.T, env []string, re *regexp.Regexp, within time.Duration, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(within)
	var out, errOut string
	for time.Now().Before(deadline) {
		out, errOut, _ = sched(t, env, args...)
		if re.MatchString(out) {
			return out
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("sched %v never matched %v; last:\n%s%s", args, re, out, errOut)
	return ""
}

// lineOf returns the first line of out that starts with prefix.
func lineOf(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// trainingSetup is a data directory a `sched worker --queues gpu=1`
// trains run "eta" from: a tokenizer in its catalog, a token store made
// by it, and a runs file with the tiny model on the CPU engine.
func trainingSetup(t *testing.T) (env []string, rdb *redis.Client, q *scheduler.Client) {
	t.Helper()
	return trainingSetupStore(t, "")
}

// appendRuns adds entries, YAML, to the runs file that env's KILN_RUNS
// names.
func appendRuns(t *testing.T, env []string, entries string) {
	t.Helper()
	var runsFile string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "KILN_RUNS="); ok {
			runsFile = v
		}
	}
	f, err := os.OpenFile(runsFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(entries); err != nil {
		t.Fatal(err)
	}
}

// editRuns replaces the first from in the runs file that env's KILN_RUNS
// names with to: a runs entry edited between enqueues.
func editRuns(t *testing.T, env []string, from, to string) {
	t.Helper()
	runsFile := envValue(env, "KILN_RUNS")
	b, err := os.ReadFile(runsFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), from) {
		t.Fatalf("the runs file holds no %q to replace:\n%s", from, b)
	}
	if err := os.WriteFile(runsFile, []byte(strings.Replace(string(b), from, to, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// trainingSetupStore is trainingSetup with the run's store, when name is
// set, at <data dir>/tokens/<name> and named so in the mixture, as the
// preset runs name theirs: a segment then waits while the store is being
// ingested.
func trainingSetupStore(t *testing.T, name string) (env []string, rdb *redis.Client, q *scheduler.Client) {
	t.Helper()
	r := testsvc.StartRedis(t)
	data := t.TempDir()
	tokPath, sha := trainTestTokenizer(t, "package main\nfunc f() {}\n")
	b, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(data, "tokenizers", "tk"), 0o755)
	if err := os.WriteFile(filepath.Join(data, "tokenizers", "tk", "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	store := trainTestStoreBy(t, sha, 280, 400_000)
	if name != "" {
		dst := filepath.Join(data, "tokens", name)
		os.MkdirAll(filepath.Dir(dst), 0o755)
		if err := os.Rename(store, dst); err != nil {
			t.Fatal(err)
		}
		store = name
	}
	// A long run in one segment with rare logs: the run's state hash
	// changes only every 20 steps, so a status read between two reads of
	// the hash that agree saw that very state; and the segment runs until
	// it is cancelled, so the test's cancel always finds it running (a
	// segment bounded in steps could end, and the next begin, between
	// finding its id and cancelling it).
	runsFile := filepath.Join(t.TempDir(), "runs.yaml")
	yaml := fmt.Sprintf(`eta:
  model: tiny
  seq: 32
  batch: 2
  accumulate: 1
  lr: 1.0e-3
  warmup: 2
  total_steps: 1000000
  log_every: 20
  eval_every: 0
  eval_batches: 0
  checkpoint_every: 20
  seed: 3
  engine: cpu
  precision: fp32
  tokenizer: tk
  mixture:
    - {store: %s, weight: 1}
  retention:
    keep_last: 2
`, store)
	if err := os.WriteFile(runsFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	env = []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_RUNS=" + runsFile, "KILN_LOG_FORMAT=json"}
	rdb = redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	q = scheduler.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	t.Cleanup(func() { q.Close() })
	return env, rdb, q
}

// A run trained by a real worker shows in `sched status` as training,
// with its ETA equal to the tokens left over the rate the segment
// measured; its running task shows the same ETA and its rate in tok/s.
// Cancelled, it reads cancelled with no ETA, and `sched runs` says so;
// queued again it trains again; its worker killed, it reads worker lost,
// with no ETA. --watch draws progress bars, and into a pipe writes plain
// blocks without one escape byte.
func TestStatusTrainingRunETACancelAndLostWorker(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	first := scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"}
	if _, err := q.Enqueue(ctx, first); err != nil {
		t.Fatal(err)
	}

	// The segment writes its state every 20 steps, which on a busy
	// machine can be more often than a status call ends: its task process
	// is stopped (SIGSTOP) while status reads, so that the state it reads
	// is the one read before and after.
	var state map[string]string
	var line, taskLine string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("no status of run eta training agreed with its state hash; last run line %q, state %v", line, state)
		}
		before, err := rdb.HGetAll(ctx, scheduler.RunStateKey("eta")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if before["tok_per_s"] == "" {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		resume := freezeChildren(t, w.Process.Pid)
		before, _ = rdb.HGetAll(ctx, scheduler.RunStateKey("eta")).Result()
		out, errOut, code := sched(t, env, "status")
		after, _ := rdb.HGetAll(ctx, scheduler.RunStateKey("eta")).Result()
		resume()
		if code != 0 {
			t.Fatalf("status: exit %d: %s", code, errOut)
		}
		line = lineOf(out, "eta  ")
		if fmt.Sprint(before) == fmt.Sprint(after) && before["tok_per_s"] != "" && strings.HasPrefix(line, "eta  training  ") {
			state, taskLine = before, lineOf(out, "train:segment:")
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The run's name where a task's id goes is named as a run, where it
	// was "task not found"; an empty id is refused, where it printed the
	// whole status.
	wantRefused(t, env, `"eta" is a run, not a task id: 'sched runs' and 'sched status' show its progress, 'sched results eta' its figures`, "status", "eta")
	wantRefused(t, env, `sched status "": the task id is empty`, "status", "")
	step, _ := strconv.Atoi(state["step"])
	total, _ := strconv.Atoi(state["total"])
	rate, _ := strconv.ParseFloat(state["tok_per_s"], 64)
	// The run file's shape: batch 2 x seq 32 x accumulate 1 tokens a step.
	left := float64(total-step) * 2 * 32
	want := "ETA " + formatETA(time.Duration(left/rate*float64(time.Second)))
	if total != 1_000_000 || rate <= 0 || !strings.Contains(line, want+"  ") {
		t.Fatalf("run line %q; want %q: (%d - %d) steps x 64 tokens at the measured %.0f tok/s", line, want, total, step, rate)
	}
	if !strings.Contains(line, formatRate(rate, "tok")) || !strings.Contains(line, " tok/s") {
		t.Fatalf("run line %q lacks its rate in tok/s", line)
	}
	// Its running task says the rate its ETA is of: the run's, where it
	// said the task's own, which a step's figure differed from.
	if !strings.Contains(taskLine, "  "+formatRate(rate, "tok")+"  "+want+"  ") {
		t.Fatalf("task line %q; want the run's rate %s and %s", taskLine, formatRate(rate, "tok"), want)
	}
	// The run and its task are on the worker that WORKERS lists, not on
	// the process the worker runs the task in, and the worker counts it.
	on := regexp.MustCompile(`  on (\S+)$`)
	out, _, _ := sched(t, env, "status")
	runOn, taskOn := on.FindStringSubmatch(lineOf(out, "eta  ")), on.FindStringSubmatch(lineOf(out, "train:segment:"))
	if runOn == nil || taskOn == nil || runOn[1] != taskOn[1] || !strings.Contains(out, "\nWORKERS\n"+runOn[1]+"  gpu=1  1 running  ") {
		t.Fatalf("the run and its task are not on the one listed worker:\n%s", out)
	}

	// --watch into a pipe: plain blocks with bars, never an escape byte.
	watchOut := watchPipe(t, env, 2)
	if bytes.IndexByte(watchOut, 0x1b) >= 0 {
		t.Fatalf("status --watch into a pipe wrote an escape byte:\n%q", watchOut)
	}
	if !regexp.MustCompile(`(?m)^train:segment:\S+  active  \[#*\.*\] \d+\.\d%  \S+ tok/s  ETA `).Match(watchOut) {
		t.Fatalf("status --watch shows no progress bar with rate and ETA for the running segment:\n%s", watchOut)
	}
	if tmuxPath, err := exec.LookPath("tmux"); err == nil {
		screen := watchInTmux(t, tmuxPath, env)
		writeCapture(t, screen)
	}

	// Cancelled: no ETA, and runs says what happened.
	running := waitRunningSegment(t, q)
	out, errOut, code := sched(t, env, "cancel", running)
	if code != 0 {
		t.Fatalf("cancel: exit %d: %s %s", code, out, errOut)
	}
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^eta  cancelled  `), time.Minute, "status")
	if l := lineOf(out, "eta  "); strings.Contains(l, "ETA") || strings.Contains(l, "tok/s") {
		t.Fatalf("a cancelled run shows a live-looking figure: %q", l)
	}
	// Nor when it last reported, which is said of a run still going.
	if l := lineOf(out, "eta  "); strings.Contains(l, "last report") {
		t.Fatalf("a cancelled run says when it last reported: %q", l)
	}
	out, _, _ = sched(t, env, "runs")
	if !strings.Contains(out, running+"  archived  cancelled by sched cancel") || lineOf(out, "eta  cancelled  ") == "" {
		t.Fatalf("runs does not say run eta and task %s were cancelled:\n%s", running, out)
	}

	// Queued again from its checkpoint, it trains again; its worker
	// killed, it reads worker lost, and neither line has an ETA.
	st, err := scheduler.ReadRunStates(ctx, rdb)
	if err != nil || len(st) != 1 {
		t.Fatalf("run states %v %v", st, err)
	}
	again := scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu", FromStep: int64(st[0].Checkpoint)}
	if _, err := q.Enqueue(ctx, again); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, env, regexp.MustCompile(`(?m)^eta  training  .*ETA `), time.Minute, "status")
	if err := w.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^eta  worker lost  `), time.Minute, "status")
	l := lineOf(out, "eta  ")
	tl := lineOf(out, "train:segment:")
	if strings.Contains(l, "ETA") || !strings.Contains(tl, "  worker lost  ") || strings.Contains(tl, "ETA") {
		t.Fatalf("a run whose worker was killed shows a live-looking ETA, or its task is not lost:\n%s\n%s", l, tl)
	}
	if !strings.Contains(out, "no worker is running") {
		t.Fatalf("status lists a worker after the only one was killed:\n%s", out)
	}
}

// freezeChildren stops every child process of pid (SIGSTOP) and waits
// until each of their threads is stopped; the returned func lets them go
// on (SIGCONT). A worker's children are the processes its tasks run in.
func freezeChildren(t *testing.T, pid int) (resume func()) {
	t.Helper()
	kids := childPIDs(pid)
	if len(kids) == 0 {
		t.Fatalf("worker %d runs no task process to stop", pid)
	}
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGSTOP)
	}
	resume = func() {
		for _, k := range kids {
			_ = syscall.Kill(k, syscall.SIGCONT)
		}
	}
	deadline := time.Now().Add(time.Minute)
	for _, k := range kids {
		for !testsvc.AllThreadsStopped(k) {
			if time.Now().After(deadline) {
				resume()
				t.Fatalf("process %d, a child of the worker, did not stop on SIGSTOP", k)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return resume
}

// childPIDs lists the processes whose parent is pid (from /proc).
func childPIDs(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ppid, ok := procStat(fmt.Sprintf("/proc/%d/stat", n)); ok && ppid == pid && st != 'Z' {
			kids = append(kids, n)
		}
	}
	return kids
}

// procStat reads a /proc stat file's state letter and parent pid; the
// command name before them is in parentheses and may hold spaces.
func procStat(path string) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err == nil
}

// waitRunningSegment returns the id of the active train:segment task.
func waitRunningSegment(t *testing.T, q *scheduler.Client) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		snap, err := q.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range snap.Running() {
			if ts.Kind == scheduler.KindTrainSegment {
				return ts.ID
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("no train:segment task became active")
	return ""
}

// watchPipe runs `sched status --watch` with its output in a pipe until it
// has written n blocks, then interrupts it; it must exit 0.
func watchPipe(t *testing.T, env []string, n int) []byte {
	t.Helper()
	w := startWatch(t, env)
	sc, out := w.sc, &w.out
	blocks := 0
	for blocks < n && sc.Scan() {
		// A block is complete once its last section has been written.
		if strings.HasPrefix(sc.Text(), "FAILURES in the last") {
			blocks++
		}
	}
	// The rest of the last block: up to the blank line before the next.
	for sc.Scan() && sc.Text() != "" {
	}
	w.interrupt()
	if blocks < n || strings.Count(out.String(), "kiln status at ") < n {
		t.Fatalf("status --watch wrote %d blocks, want %d:\n%s", blocks, n, out.String())
	}
	return out.Bytes()
}

// watch is a `sched status --watch` process writing into a pipe, read
// line by line by sc and kept whole in out.
type watch struct {
	t           *testing.T
	cmd         *exec.Cmd
	pipe        io.Reader
	sc          *bufio.Scanner
	out, errOut bytes.Buffer
}

// startWatch starts `sched status --watch --interval 200ms` with env.
func startWatch(t *testing.T, env []string) *watch {
	t.Helper()
	w := &watch{t: t, cmd: exec.Command(os.Args[0], "status", "--watch", "--interval", "200ms")}
	w.cmd.Env = append(baseEnv(t), env...)
	pipe, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.pipe = pipe
	w.cmd.Stderr = &w.errOut
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.sc = bufio.NewScanner(io.TeeReader(pipe, &w.out))
	return w
}

// interrupt ends the watch as ctrl-c does; it must exit 0.
func (w *watch) interrupt() {
	w.t.Helper()
	w.cmd.Process.Signal(os.Interrupt)
	io.Copy(io.Discard, w.pipe)
	if err := w.cmd.Wait(); err != nil {
		w.t.Fatalf("status --watch after ctrl-c: %v; stderr %s", err, w.errOut.String())
	}
}

// watchInTmux runs `sched status --watch` on a tmux pseudo-terminal and
// returns its screen once it has redrawn in place: a later frame (a new
// time line) on the screen, and still one frame on it, not two stacked.
func watchInTmux(t *testing.T, tmux string, env []string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	run := func(args ...string) string {
		c := exec.Command(tmux, append([]string{"-S", sock}, args...)...)
		b, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v: %s", args, err, b)
		}
		return string(b)
	}
	cmdline := "env -i " + shellQuote(append(baseEnv(t), env...)...) + " " + shellQuote(os.Args[0], "status", "--watch", "--interval", "500ms")
	run("new-session", "-d", "-x", "200", "-y", "50", "-s", "watch", cmdline+"; sleep 60")
	t.Cleanup(func() { exec.Command(tmux, "-S", sock, "kill-server").Run() })
	header := regexp.MustCompile(`kiln status at (\S+ \S+)`)
	var first, screen string
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		screen = run("capture-pane", "-p", "-t", "watch")
		m := header.FindAllStringSubmatch(screen, -1)
		if len(m) > 1 {
			t.Fatalf("status --watch on a terminal stacked frames instead of redrawing:\n%s", screen)
		}
		if len(m) == 1 && strings.Contains(screen, "RUNNING") {
			if first == "" {
				first = m[0][1]
			} else if m[0][1] != first && strings.Contains(screen, " tok/s  ETA ") {
				return screen
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("status --watch on a terminal never redrew with a running segment; screen:\n%s", screen)
	return ""
}

func shellQuote(args ...string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// writeCapture keeps the captured screen for the documentation when
// KILN_STATUS_CAPTURE names a file.
func writeCapture(t *testing.T, screen string) {
	if p := os.Getenv("KILN_STATUS_CAPTURE"); p != "" {
		if err := os.WriteFile(p, []byte(screen), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// --interval and bad values of it are refused before anything is read.
func TestStatusWatchBadInput(t *testing.T) {
	t.Parallel()
	env := []string{"KILN_REDIS_URL=redis://127.0.0.1:1/0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--interval", "1s"}, "--interval 1s: it sets the refresh of --watch"},
		{[]string{"status", "--watch", "--interval", "1ms"}, "--interval 1ms: give 100ms or more"},
		{[]string{"status", "--watch", "--interval", "soon"}, `--interval "soon" is not a duration such as 30s`},
	} {
		_, errOut, code := sched(t, env, c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") > 0 {
			t.Errorf("%v: exit %d, %q; want exit 2 and one line with %q", c.args, code, errOut, c.want)
		}
	}
}

func TestUnits(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{formatRate(5805, "tok"), "5.8k tok/s"},
		{formatRate(1.2e6, "tok"), "1.2M tok/s"},
		{formatRate(89.1e6, "B"), "89.1 MB/s"},
		{formatRate(8.913e5, "B/s"), "891 kB/s"},
		{formatRate(1116, "tasks"), "1.1k tasks/s"},
		{formatRate(3.4, "files"), "3.4 files/s"},
		{formatRate(0.25, "files"), "0.25 files/s"},
		{formatRate(512, "B"), "512 B/s"},
		{formatRate(999.96e6, "B"), "1.0 GB/s"},
		{formatBytes(1_500_000_000), "1.5 GB"},
		{formatETA(42 * time.Second), "42s"},
		{formatETA(12*time.Minute + 5*time.Second), "12m5s"},
		{formatETA(3*time.Hour + 33*time.Minute + 20*time.Second), "3h33m"},
		{formatETA(100 * time.Hour), "4d4h"},
		{bar(0.5, 10), "[#####.....]"},
		{bar(1.5, 4), "[####]"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// A run's line never shows its checkpoint ahead of its step: the step
// and loss are written at most once a second and a checkpoint when it is
// uploaded, so the state can hold a checkpoint newer than its step. The
// line then shows the checkpoint's step, and the loss with its own.
func TestARunsLineShowsNoCheckpointAheadOfItsStep(t *testing.T) {
	now := time.Date(2026, 12, 1, 11, 19, 0, 0, time.UTC)
	v := runView{RunState: scheduler.RunState{Run: "eta", Step: 20, Total: 1000, Loss: 7.6059, Checkpoint: 40}, HasState: true, Status: runTraining}
	line := v.line(now)
	if !strings.Contains(line, "step 40/1000 (4.0%)") || !strings.Contains(line, "loss 7.6059 at step 20") || !strings.Contains(line, "last checkpoint step 40") {
		t.Errorf("line %q; want step 40, the loss at step 20, checkpoint 40", line)
	}
	v.Step = 60
	line = v.line(now)
	if !strings.Contains(line, "step 60/1000 (6.0%)  loss 7.6059  ") {
		t.Errorf("line %q; want step 60 with its loss", line)
	}
	// A run on several GPUs says how many beside its rate.
	v.TokPerS, v.GPUs = 3.3e6, 2
	if line = v.line(now); !strings.Contains(line, "  3.3M tok/s on 2 GPUs  ") {
		t.Errorf("line %q; want its rate on 2 GPUs", line)
	}
}

// A training run is on the worker its segment task runs on, which the
// task says as it starts: the run's state names the worker of its last
// step, a dead one until the segment taken back trains its first.
func TestARunsLineNamesTheWorkerItsSegmentRunsOn(t *testing.T) {
	now := time.Date(2026, 12, 1, 11, 19, 0, 0, time.UTC)
	v := runView{RunState: scheduler.RunState{Run: "eta", Step: 20, Total: 1000, Checkpoint: 20, Worker: "vm:14244"}, HasState: true, Status: runTraining}
	if line := v.line(now); !strings.HasSuffix(line, "  on vm:14244") {
		t.Errorf("line %q; want the state's worker where the task says none", line)
	}
	v.Task = &scheduler.TaskStatus{State: "active", HasProgress: true, Progress: scheduler.Progress{Worker: "vm:14517"}}
	if line := v.line(now); !strings.HasSuffix(line, "  on vm:14517") {
		t.Errorf("line %q; want the worker its segment runs on", line)
	}
}

// A running task that has not reported for minutes says when it last did;
// one that reports as it goes does not.
func TestAQuietTaskSaysWhenItLastReported(t *testing.T) {
	now := time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC)
	ts := scheduler.TaskStatus{ID: "train:segment:x", Kind: scheduler.KindTrainSegment, State: "active", HasProgress: true,
		Progress: scheduler.Progress{Fraction: 0.5, Message: "step 500/1000", Worker: "gpu-a", Updated: now.Add(-time.Second)}}
	if line := taskLine(ts, nil, now, false, listErrRunes); strings.Contains(line, "last report") {
		t.Errorf("a task that reported a second ago: %q", line)
	}
	ts.Progress.Updated = now.Add(-7 * time.Minute)
	if line := taskLine(ts, nil, now, false, listErrRunes); !strings.HasSuffix(line, "on gpu-a  last report 7m0s ago") {
		t.Errorf("a task silent for 7 minutes: %q; want it to end with when it last reported", line)
	}
}

// `status --watch` goes on through a Redis outage: a refresh that fails
// names the Redis (its address, masked as everywhere) and the setting that
// points at it, and the next refresh once Redis is back draws the status
// again. The refreshes written to the pipe are the events waited on.
func TestStatusWatchNamesRedisThroughAnOutage(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	// A password the server does not ask for, so that its masking shows.
	w := startWatch(t, []string{"KILN_REDIS_URL=redis://:sekret@" + r.Addr + "/0"})
	// Only if a line never comes: the pipe then ends and the test fails.
	stop := time.AfterFunc(2*time.Minute, func() { w.cmd.Process.Kill() })
	defer stop.Stop()
	sc, out, errOut := w.sc, &w.out, &w.errOut
	next := func(prefix string) string {
		t.Helper()
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), prefix) {
				return sc.Text()
			}
		}
		t.Fatalf("status --watch never wrote a line starting %q:\n%s\nstderr: %s", prefix, out.String(), errOut.String())
		return ""
	}
	next("FAILURES in the last")
	r.Stop()
	line := next("status not read")
	want := "status not read from Redis at redis://:xxxxx@" + r.Addr + "/0 (KILN_REDIS_URL or --redis-url): "
	if !strings.HasPrefix(line, want) || !strings.HasSuffix(line, "; trying again every 200ms") || strings.Contains(line, "sekret") {
		t.Errorf("refresh with Redis down: %q, want %q..., trying again", line, want)
	}
	r.Start()
	next("FAILURES in the last")
	w.interrupt()
}

// The first connection to a plain Redis through a rediss:// URL fails
// with a timeout only; the line that says Redis cannot be reached adds
// that rediss:// means TLS, which the server may not speak.
func TestRedissToAPlainRedisSaysWhatRedissMeans(t *testing.T) {
	t.Parallel()
	url := "rediss://" + testsvc.Redis(t) + "/0"
	_, errOut, code := sched(t, []string{"KILN_REDIS_URL=" + url}, "status")
	if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Fatalf("status over %s: exit %d, %q; want exit 2 and one line", url, code, errOut)
	}
	for _, want := range []string{"cannot reach Redis at " + url + " (KILN_REDIS_URL or --redis-url)", "rediss:// means TLS, which this server may not speak: use redis:// for a Redis without TLS"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("status over %s: %q lacks %q", url, errOut, want)
		}
	}
}

// A store whose latest plan found every file in the store and queued none
// says so, not "files 0/0 done"; a plan still running or cancelled does
// not.
func TestDatasetLineOfAPlanThatQueuedNothing(t *testing.T) {
	done := datasetLine(scheduler.DatasetProgress{Store: "code", Datasets: []string{"local:/src/*.go"}, PlanDone: true}, nil, time.Time{})
	if done != "code (local:/src/*.go)  nothing to ingest: the store holds every file its latest plan listed" {
		t.Errorf("a plan that queued nothing: %q", done)
	}
	two := datasetLine(scheduler.DatasetProgress{Store: "code", Datasets: []string{"local:/src/*.go", "the-stack-v2"}, PlanDone: true}, nil, time.Time{})
	if !strings.HasPrefix(two, "code (local:/src/*.go, the-stack-v2)  ") {
		t.Errorf("a store of two datasets: %q", two)
	}
	for _, d := range []scheduler.DatasetProgress{{Store: "code", Planning: true}, {Store: "code"}} {
		if l := datasetLine(d, nil, time.Time{}); strings.Contains(l, "nothing to ingest") {
			t.Errorf("%+v: %q", d, l)
		}
	}
}

// A task whose attempt failed says its error once: the worker writes it as
// the task's message and asynq keeps it as the last error, and the line
// showed both. Listed among others, it is cut to a line's length; asked
// for alone, it is whole. A message that says something else stays.
func TestAFailedTaskSaysItsErrorOnce(t *testing.T) {
	now := time.Date(2026, 12, 6, 5, 0, 0, 0, time.UTC)
	why := "ingest:shard of owner/data file data/part-7.parquet: " + strings.Repeat("the hub answered 503 Service Unavailable; ", 8) + "run sched retry once it answers"
	ts := scheduler.TaskStatus{ID: "ingest:shard:x", Kind: scheduler.KindIngestShard, State: "archived", Retried: 3,
		LastErr: why + " (skip retry for the task)", HasProgress: true,
		Progress: scheduler.Progress{State: "failed", Fraction: 0.25, Message: why, Updated: now.Add(-time.Minute)}}
	alone := taskLine(ts, nil, now, false, taskErrRunes)
	if strings.Count(alone, "503 Service Unavailable; the hub") != 7 || !strings.HasSuffix(alone, "last error: "+why) {
		t.Errorf("the task alone: %q; want its whole error once, as its last error", alone)
	}
	listed := taskLine(ts, nil, now, false, listErrRunes)
	if !strings.Contains(listed, "last error: ingest:shard of owner/data") || strings.Count(listed, "owner/data") != 1 || len([]rune(listed)) > listErrRunes+60 {
		t.Errorf("the task listed: %q; want its error once, cut to %d characters", listed, listErrRunes)
	}
	// An error of several lines (errors.Join's) is said whole, once.
	joined := "train:segment pilot: the loss is NaN at step 40\ncheckpoint of step 39: disk full"
	ts.LastErr, ts.Progress.Message = joined+" (skip retry for the task)", joined
	if line := taskLine(ts, nil, now, false, taskErrRunes); strings.Count(line, "step 40") != 1 || !strings.HasSuffix(line, "last error: train:segment pilot: the loss is NaN at step 40; checkpoint of step 39: disk full") {
		t.Errorf("a task whose error has two lines: %q; want both lines once", line)
	}
	ts.LastErr = why
	ts.Progress.Message = "read 3 of 12 row groups"
	if line := taskLine(ts, nil, now, false, taskErrRunes); !strings.Contains(line, `"read 3 of 12 row groups"`) || !strings.Contains(line, "last error: "+why) {
		t.Errorf("a task whose message is not its error: %q; want both", line)
	}
}

// A segment's task line gives the rate its ETA is of, the run's measured
// tok/s, as the run's line does: it gave the task's own report's rate
// beside an ETA of the run's, which disagreed.
func TestASegmentsTaskLineSaysTheRateOfItsETA(t *testing.T) {
	payload, err := scheduler.Encode(scheduler.TrainSegment{Run: "r"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ts := scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, State: "active", Payload: payload, HasProgress: true,
		Progress: scheduler.Progress{Fraction: 0.5, Rate: 1000, Unit: "tok", Updated: now}}
	rs := scheduler.RunState{Run: "r", Step: 500, Total: 1000, Tokens: 500 * 64, TokPerS: 3200}
	line := taskLine(ts, map[string]scheduler.RunState{"r": rs}, now, false, 200)
	eta, _ := runETA(rs) // 500 steps x 64 tokens at 3200 tok/s: 10s
	if want := "  " + formatRate(3200, "tok") + "  ETA " + formatETA(eta); !strings.HasSuffix(line, want) {
		t.Errorf("task line %q; want %q, the run's rate beside its ETA", line, want)
	}
}

// A run whose segment waits says whole what it waits for, which ends with
// what to do: waiting for the object store to take the worker's keys was
// cut before the settings to mend.
func TestAWaitingRunsLineSaysWhatToDo(t *testing.T) {
	now := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	msg := "waiting for the object store at http://minio.example.internal:9000/kiln to take this worker's keys (SignatureDoesNotMatch): set KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY and restart the worker"
	task := scheduler.TaskStatus{ID: "train:segment:x", Kind: scheduler.KindTrainSegment, Queue: "gpu", State: "retry", NextRun: now.Add(30 * time.Second),
		HasProgress: true, Progress: scheduler.Progress{State: "waiting", Message: msg, Updated: now}}
	v := runView{RunState: scheduler.RunState{Run: "pilot", Step: 120, Total: 1000, Checkpoint: 120}, HasState: true, Task: &task}
	v.classify()
	if line := v.line(now); !strings.Contains(line, msg+" (as of its last try") {
		t.Errorf("sched status's line: %q; want the whole wait, what to do included", line)
	}
	if line := outcomeLine(task); !strings.Contains(line, msg+"; looks again at ") {
		t.Errorf("sched runs's line: %q; want the whole wait, what to do included", line)
	}
}
