package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/redismem"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/worker"
)

// failureWindow is how far back `sched status` lists failures.
const failureWindow = time.Hour

func init() {
	var (
		watch    bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status [task-id]",
		Short: "Show queues, workers, running tasks, ingest per dataset, training runs and the last hour's failures, or one task",
		Example: `  sched status
  sched status --watch --interval 10s
  sched status train:segment:8258cc948f28b3fc7610`,
		Long: `status shows the queues' sizes, the worker processes that heartbeat (each
with its build, marked where its task formats are not status's own:
upgrade it, or status where the worker's are newer), each
running task with its progress, rate and ETA, each dataset's ingest (files
done of total, bytes, rate, ETA, or the --max-tokens or --max-disk it
stopped at), each training run (step, loss, tok/s over about its last
30 s of training, checkpoints included, ETA from that rate over the
tokens left; where Redis knows no run, as after it lost its data, those
whose checkpoints object storage holds, read once: where object storage
refuses the credentials, the rest is printed, then a line on stderr
naming them, and status exits 2) and the failures of the last hour with
their reason. A running task
whose worker stopped heartbeating reads "worker lost", with no ETA; a run
whose last segment has trained its last step and waits for its last
checkpoint's upload or its results reads "finishing", saying which, with
no rate or ETA. A running task, or a training run, that has not reported
for 5 minutes says when it last did, in place of its rate and ETA.

With --watch it refreshes every --interval: in place, with a progress bar
per running task, on a terminal, each line cut to its width and, where the
status has more lines than it has rows, the last row saying how many are
left out; as plain blocks, one per refresh, whole and with no escape
codes, when its output is a file or a pipe. Ctrl-C ends it.`,
		Args: maxArgs(1, "at most one task id (none for the whole status)"),
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 1 && strings.TrimSpace(args[0]) == "" {
				return badInput("sched status %q: the task id is empty; give one as 'sched status' lists them, or none for the whole status", args[0])
			}
			if c.Flags().Changed("interval") && !watch {
				return badInput("--interval %s: it sets the refresh of --watch; add --watch", interval)
			}
			if interval < 100*time.Millisecond {
				return badInput("--interval %s: give 100ms or more (e.g. --interval 2s)", interval)
			}
			cfg, err := loadConfig(c)
			if err != nil {
				return err
			}
			q, _, err := openQueue(c.Context(), cfg)
			if err != nil {
				return err
			}
			defer q.Close()
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			stored := &storedCache{cfg: cfg}
			draw := func(ctx context.Context, w io.Writer, bars bool) error {
				if id != "" {
					return redactErr(cfg, renderTask(ctx, w, q, id, bars))
				}
				return redactErr(cfg, renderStatus(ctx, w, q, stored, bars))
			}
			out := c.OutOrStdout()
			if !watch {
				return draw(c.Context(), out, false)
			}
			// A refresh that fails while Redis is away says which Redis,
			// and where it is set, rather than only a dial error.
			from := fmt.Sprintf("Redis at %s (KILN_REDIS_URL or --redis-url)", cfg.Masked().RedisURL)
			return watchStatus(c.Context(), out, terminalSize(out), interval, from, draw)
		},
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "refresh until interrupted: in place on a terminal, as plain blocks otherwise")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "time between refreshes of --watch")
	rootCmd.AddCommand(cmd)
}

// Escape sequences of the in-place redraw: cursor home, erase to the end
// of the line and of the screen, hide and show the cursor.
const (
	escHome       = "\x1b[H"
	escClearLine  = "\x1b[K"
	escClearBelow = "\x1b[J"
	escHideCursor = "\x1b[?25l"
	escShowCursor = "\x1b[?25h"
)

// watchStatus draws every interval until ctx ends. On a terminal (size
// is its size; nil for a file or a pipe) each frame overwrites the last
// (inPlace). Elsewhere each frame is a plain block under a time line. A
// failed refresh (Redis restarting) is shown, naming from (where the
// status is read), and retried, except the first, which is a
// configuration mistake and ends the command; so does object storage's
// refusal of the credentials (keysRefusedError) at the first refresh,
// once its frame, whole but for what object storage holds, is drawn.
func watchStatus(ctx context.Context, w io.Writer, size func() (cols, rows int, ok bool), interval time.Duration, from string, draw func(context.Context, io.Writer, bool) error) error {
	// A file, a pipe or a log collector gets plain text.
	tty := size != nil
	if tty {
		fmt.Fprint(w, escHideCursor+"\x1b[2J")
		// A frame's last line ends without a newline (inPlace): the
		// shell's prompt goes on the line below it.
		defer fmt.Fprint(w, "\n"+escShowCursor)
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for frame := 0; ; frame++ {
		var buf bytes.Buffer
		fmt.Fprintf(&buf, "kiln status at %s, every %s (ctrl-c to stop)\n\n", time.Now().Format("2006-01-02 15:04:05"), interval)
		err := draw(ctx, &buf, true)
		drawn := err == nil || errors.As(err, new(keysRefusedError))
		if !drawn {
			if ctx.Err() != nil {
				return nil
			}
			if frame == 0 {
				return err
			}
			fmt.Fprintf(&buf, "status not read from %s: %v; trying again every %s\n", from, err, interval)
		}
		if tty {
			cols, rows, ok := size()
			if !ok {
				cols, rows = 0, 0
			}
			io.WriteString(w, inPlace(buf.String(), cols, rows))
		} else {
			if frame > 0 {
				io.WriteString(w, "\n")
			}
			w.Write(buf.Bytes())
		}
		if drawn && err != nil && frame == 0 {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// terminalSize is the size of w where w is a terminal, read at each call
// (the user may resize it between frames), for --watch's frames drawn in
// place; nil where w is a file or a pipe, which gets every line whole.
func terminalSize(w io.Writer) func() (cols, rows int, ok bool) {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return func() (int, int, bool) {
		cols, rows, err := term.GetSize(int(f.Fd()))
		return cols, rows, err == nil && cols > 0 && rows > 0
	}
}

// inPlace is frame as --watch draws it over the last one on a terminal of
// cols columns and rows rows (0: not known, nothing cut): from the top
// left, each line cleared, then written, so that a shorter line leaves
// nothing of the last frame's and nothing flickers, then everything below
// cleared. It must take no more rows than the terminal has, or each
// refresh scrolls it and leaves a copy of the frame above (a status line
// is 100 to 230 characters wide): each line is cut to cols (its end
// marked "…"), and a frame of more lines than rows shows rows-1 of them
// and a last line that says how many more there are and how to see them.
// Its last line ends without a newline, which on the bottom row would
// scroll the screen.
func inPlace(frame string, cols, rows int) string {
	lines := strings.Split(strings.TrimSuffix(frame, "\n"), "\n")
	if rows > 0 && len(lines) > rows {
		more := len(lines) - (rows - 1)
		what := "lines"
		if more == 1 {
			what = "line"
		}
		// Short, to be read whole on a terminal of 60 columns.
		lines = append(lines[:rows-1], fmt.Sprintf("(%d more %s: make the terminal taller, or drop --watch)", more, what))
	}
	var b strings.Builder
	b.WriteString(escHome)
	for i, line := range lines {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(escClearLine + clipLine(line, cols))
	}
	b.WriteString(escClearBelow)
	return b.String()
}

// clipLine is line cut to cols characters, its last one "…" where it is
// cut; line itself where cols is 0. A status line is text of one column a
// character: no tabs, no escapes, no wide characters.
func clipLine(line string, cols int) string {
	if cols <= 0 || utf8.RuneCountInString(line) <= cols {
		return line
	}
	return string([]rune(line)[:cols-1]) + "…"
}

// renderTask writes one task's line.
func renderTask(ctx context.Context, w io.Writer, q *scheduler.Client, id string, bars bool) error {
	ts, err := q.Task(ctx, id)
	if err != nil {
		return runNotTask(ctx, q, id, "status", err)
	}
	var runs map[string]scheduler.RunState
	if ts.Kind == scheduler.KindTrainSegment {
		states, err := scheduler.ReadRunStates(ctx, q.Redis())
		if err != nil {
			return err
		}
		runs = statesByRun(states)
	}
	fmt.Fprintln(w, taskLine(ts, runs, time.Now(), bars, taskErrRunes))
	return nil
}

// runNotTask is the error of 'sched <verb> name' (status, cancel, retry),
// which take a task's id, where no queue holds a task of that id (err, a
// *scheduler.NotFoundError) and name is a run's: "stop a run" is typed
// 'sched cancel pilot', where a run is a chain of segment tasks. It says
// so, and what to type instead: the command with its live or last
// segment's id where it has one, 'sched enqueue train' where that is what
// the user means. Any other err, or a name no run has, is err unchanged.
func runNotTask(ctx context.Context, q *scheduler.Client, name, verb string, err error) error {
	var nf *scheduler.NotFoundError
	if !errors.As(err, &nf) {
		return err
	}
	v, ok := runNamed(ctx, q, name)
	if !ok {
		return err
	}
	return badInput("%s", runInstead(v, verb))
}

// runNamed is the run called name as 'sched status' shows it, with its
// newest segment task, and whether name is a run at all: one whose state
// Redis holds (it trained), one with a segment live in the queues (queued
// by a machine whose runs file this one lacks), or one of the runs known
// here (the presets and KILN_RUNS's file), which may never have started.
// A lookup that fails says it is not one: the caller's own error stands.
func runNamed(ctx context.Context, q *scheduler.Client, name string) (runView, bool) {
	st, known, err := scheduler.ReadRunState(ctx, q.Redis(), name)
	if err != nil {
		return runView{}, false
	}
	live, err := q.LiveSegment(ctx, name)
	if err != nil {
		return runView{}, false
	}
	if !known && live == nil {
		if set, err := runs.Load(os.Getenv("KILN_RUNS")); err != nil || !slices.Contains(set.Names(), name) {
			return runView{}, false
		}
	}
	var states []scheduler.RunState
	if known {
		states = append(states, st)
	}
	// The live segment alone where there is one (a run has at most one);
	// else every task, for the newest of the run's finished segments.
	var snap *scheduler.Snapshot
	if live != nil {
		ts, err := q.Task(ctx, live.ID)
		if err != nil {
			return runView{}, false
		}
		snap = &scheduler.Snapshot{At: time.Now(), Tasks: []scheduler.TaskStatus{ts}}
	} else if snap, err = q.Snapshot(ctx); err != nil {
		return runView{}, false
	}
	for _, v := range runViews(states, snap) {
		if v.Run == name {
			return v, true
		}
	}
	// Known by its runs entry alone: no state, no segment.
	v := runView{RunState: st}
	v.classify()
	return v, true
}

// runInstead says of run v, named where 'sched verb' takes a task id, what
// to type instead, in one line.
func runInstead(v runView, verb string) string {
	run := v.Run
	head := fmt.Sprintf("%q is a run, not a task id", run)
	seg := ""
	live := false
	if v.Task != nil {
		seg = v.Task.ID
		live = !v.Task.Ended()
	}
	switch verb {
	case "cancel":
		if live {
			stops := "stops it"
			if v.Task.State != "active" {
				stops = "withdraws it, and it does not run"
			}
			return fmt.Sprintf("%s: its segment %s is %s: 'sched cancel %s' %s (%s)", head, seg, liveWord(v), seg, stops, resumeWith(v))
		}
		return fmt.Sprintf("%s, and no segment of it is queued or running: nothing to cancel (%s)", head, runNow(v))
	case "retry":
		if live {
			return fmt.Sprintf("%s: its segment %s is %s already: nothing to retry ('sched status %s' follows it)", head, seg, liveWord(v), seg)
		}
		if v.Task != nil && v.Task.State == "archived" && v.Status != runDone {
			what := "failed"
			if v.Task.Cancelled {
				what = "was cancelled by sched cancel"
			}
			from := "resuming the run from its last checkpoint"
			if !v.HasState || v.Checkpoint <= 0 {
				from = "starting the run, which has no checkpoint"
			}
			return fmt.Sprintf("%s: its last segment %s %s: 'sched retry %s' runs it again, %s", head, seg, what, seg, from)
		}
		return fmt.Sprintf("%s: nothing of it to retry (%s)", head, runNow(v))
	}
	which := "'sched status ID' takes the id of one of its tasks"
	switch {
	case live:
		which = fmt.Sprintf("'sched status %s' shows its live segment", seg)
	case seg != "":
		which = fmt.Sprintf("'sched status %s' shows its last segment", seg)
	case v.Status == runNotStarted:
		which = "it has no segment: 'sched enqueue train " + run + "' starts it"
	}
	return fmt.Sprintf("%s: 'sched runs' and 'sched status' show its progress, 'sched results %s' its figures; %s", head, run, which)
}

// liveWord is what the live segment of run v is doing, as its line in
// 'sched status' says it.
func liveWord(v runView) string {
	switch v.Status {
	case runLost:
		return "held by a worker that stopped heartbeating"
	case runRequeued:
		return "queued again after its worker stopped it"
	case runRetrying:
		return "waiting to retry"
	case runFinishing:
		return "finishing (its training is over)"
	}
	return v.Status
}

// resumeWith says how run v goes on once its live segment is cancelled: a
// segment that trains writes the checkpoint of the step it stops at.
func resumeWith(v runView) string {
	if v.Task.State == "active" || (v.HasState && v.Checkpoint > 0) {
		return "it resumes from its last checkpoint with 'sched enqueue train " + v.Run + "'"
	}
	return "'sched enqueue train " + v.Run + "' queues it again"
}

// runNow says where run v, with no live segment, stands, and what goes on
// with it.
func runNow(v runView) string {
	enqueue := "'sched enqueue train " + v.Run + "'"
	switch {
	case v.Status == runDone:
		return fmt.Sprintf("it is done at step %d of %d; a longer run is %s after its total is raised", v.Step, v.Total, enqueue)
	case v.Status == runNotStarted:
		return "it has not started: " + enqueue + " starts it"
	case v.Task != nil && v.Task.State == "archived":
		what := "failed"
		if v.Task.Cancelled {
			what = "was cancelled"
		}
		return fmt.Sprintf("its last segment %s %s: 'sched retry %s' runs it again", v.Task.ID, what, v.Task.ID)
	case !v.HasState || v.Checkpoint <= 0:
		return enqueue + " starts it"
	}
	return enqueue + " resumes it from its last checkpoint"
}

func statesByRun(states []scheduler.RunState) map[string]scheduler.RunState {
	m := make(map[string]scheduler.RunState, len(states))
	for _, s := range states {
		m[s.Run] = s
	}
	return m
}

// storedCache is `sched status`'s read of the runs object storage holds
// checkpoints of (readStoredRuns). Status reads it only while Redis knows
// no run at all, the one case where a run known by its checkpoints alone
// would otherwise read as "no training runs" (Redis lost its data), and
// once until Redis knows a run again: a --watch redraws every 2 s from
// Redis alone, which a listing of the store on every frame would slow,
// and a store that does not answer would hold each frame for openStore's
// 15 s check. A run gets checkpoints only while Redis records it, so the
// one read stays true until Redis knows a run again; `sched runs` reads
// the store every time, beside the runs Redis knows.
type storedCache struct {
	cfg  scheduler.Config
	have bool
	runs storedRuns
	// stores is what object storage says of the stores whose plan Redis
	// lost (planLost).
	stores storeStatuses
}

// buildSays is what a worker's line in WORKERS says of its build, b (ok:
// it publishes one), beside this sched's, mine; other is set where the
// worker is marked to upgrade. What marks it is its task formats (payload
// versions): a worker of others queues work that the workers of this one
// refuse, and refuses theirs. A build of the same formats is only named:
// an image built without its commit (compose's, "dev (commit unknown)")
// beside a sched built from a checkout, or a patch release, works with
// this one. One that publishes none is a kiln older than this, unless
// Redis is full (it refuses the builds' writes too) or started less than
// worker.BuildsSettle ago (redisUp; negative where unknown), when the
// worker's next write has not come yet: a missing build then says nothing
// of the worker. Where its formats are all newer than this sched's, this
// sched, and the workers of its build, are the older. What to do comes
// first: --watch cuts a line at the terminal's width.
func buildSays(b worker.Build, ok bool, mine worker.Build, redisFull bool, redisUp time.Duration) (said string, other bool) {
	switch {
	case !ok && redisFull:
		return "build unknown", false
	case !ok && redisUp >= 0 && redisUp < worker.BuildsSettle:
		return fmt.Sprintf("build not published yet (Redis started %s ago)", redisUp), false
	case !ok:
		return "upgrade it: it publishes no build, a kiln older than this sched", true
	}
	var ps []string
	newer := true
	for _, k := range b.OtherPayloads(mine) {
		ps = append(ps, fmt.Sprintf("%s v%d, here v%d", k, b.Payloads[k], mine.Payloads[k]))
		newer = newer && b.Payloads[k] > mine.Payloads[k]
	}
	if len(ps) == 0 {
		return b.Short(), false
	}
	formats := b.Short() + " (" + strings.Join(ps, "; ") + ")"
	if newer {
		return "newer task formats, upgrade this sched and the workers of its build: " + formats, true
	}
	return "upgrade it, other task formats: " + formats, true
}

// read returns object storage's runs where Redis knows none (redisRuns
// is 0), reading them the first time, and nothing otherwise.
func (c *storedCache) read(ctx context.Context, redisRuns int) storedRuns {
	if redisRuns > 0 {
		c.have = false
		return storedRuns{}
	}
	if !c.have {
		c.runs, c.have = readStoredRuns(ctx, c.cfg), true
	}
	return c.runs
}

// renderStatus writes the whole status: queues, workers, running tasks,
// ingest per dataset, runs and recent failures.
func renderStatus(ctx context.Context, w io.Writer, q *scheduler.Client, stored *storedCache, bars bool) error {
	snap, err := q.Snapshot(ctx)
	if err != nil {
		return err
	}
	states, err := scheduler.ReadRunStates(ctx, q.Redis())
	if err != nil {
		return err
	}
	now := snap.At
	if snap.RedisFull() {
		// First: every line below is read from a Redis that takes no
		// write, and what it lacks (heartbeats, progress) is why.
		fmt.Fprintln(w, redisFullLine(snap.Memory))
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%-8s %6s %8s %7s %6s %9s %9s\n", "QUEUE", "SIZE", "PENDING", "ACTIVE", "RETRY", "ARCHIVED", "COMPLETED")
	for _, s := range snap.Queues {
		paused := ""
		if s.Paused {
			paused = " (paused)"
		}
		fmt.Fprintf(w, "%-8s %6d %8d %7d %6d %9d %9d%s\n", s.Name, s.Size, s.Pending, s.Active, s.Retry, s.Archived, s.Completed, paused)
	}

	fmt.Fprintln(w, "\nWORKERS")
	switch {
	case snap.RedisFull():
		// A worker's heartbeat is a write: one that runs drops out of
		// the list once its last heartbeat lapses, and another started
		// now would meet the same refusals.
		fmt.Fprintln(w, "unknown while Redis is full: it refuses the workers' heartbeats, so a worker that runs may be missing here; they are listed again once Redis takes writes")
	case len(snap.Workers) == 0:
		fmt.Fprintln(w, "no worker is running (start one with 'sched worker --queues ingest=4,append=2,gpu=1')")
	}
	names := make([]string, len(snap.Workers))
	for i, wp := range snap.Workers {
		names[i] = wp.Name
	}
	builds, err := worker.ReadBuilds(ctx, q.Redis(), names)
	if err != nil {
		return err
	}
	// Redis's uptime only where a worker lacks its build: whether its
	// write may be still to come.
	redisUp := time.Duration(-1)
	if len(builds) < len(snap.Workers) && !snap.RedisFull() {
		if up, err := worker.RedisUptime(ctx, q.Redis()); err == nil {
			redisUp = up
		}
	}
	mine, others := worker.ThisBuild(), false
	for _, wp := range snap.Workers {
		var qs []string
		for q, n := range wp.Queues {
			qs = append(qs, fmt.Sprintf("%s=%d", q, n))
		}
		sort.Strings(qs)
		b, ok := builds[wp.Name]
		said, other := buildSays(b, ok, mine, snap.RedisFull(), redisUp)
		others = others || other
		fmt.Fprintf(w, "%s  %s  %d running  up %s  %s\n", wp.Name, strings.Join(qs, ","), wp.Active, formatETA(now.Sub(wp.Started)), said)
	}
	if others {
		fmt.Fprintf(w, "this sched is %s: workers of other task formats refuse each other's tasks; bring them to one build (docs/operations.md, \"Upgrading kiln with work queued\")\n", mine.Short())
	}
	// The machine whose disk holds the token stores: the one place the
	// append queue is served from.
	if h, err := worker.AppendHolderNow(ctx, q.Redis()); err != nil {
		return err
	} else if h != nil {
		fmt.Fprintf(w, "append is served from %s: the token stores are on its disk\n", h)
	}

	fmt.Fprintln(w, "\nRUNNING")
	running := snap.Running()
	if len(running) == 0 {
		fmt.Fprintln(w, "no running tasks")
	}
	byRun := statesByRun(states)
	for _, ts := range running {
		fmt.Fprintln(w, taskLine(ts, byRun, now, bars, listErrRunes))
	}
	printWaiting(w, snap.Tasks)

	damaged, err := worker.DamagedStores(ctx, q.Redis())
	if err != nil {
		return err
	}
	deleted, err := worker.DeletedStores(ctx, q.Redis())
	if err != nil {
		return err
	}
	// Object storage refused the keys where status read it: what it
	// holds is left out, saying so, and the status ends with the error.
	var refused error
	if ds := snap.Datasets(); len(ds) > 0 || len(damaged) > 0 {
		fmt.Fprintln(w, "\nINGEST")
		for _, d := range ds {
			line := datasetLine(d, snap, deleted[d.Store])
			if d.NoPlan {
				lost, err := stored.planLost(ctx, d)
				line += "  " + lost
				refused = cmp.Or(refused, keysRefused(err))
			}
			fmt.Fprintln(w, line)
		}
		// The worker that holds the stores found these damaged: ingests
		// into them and runs over them are refused until they are
		// deleted or mended.
		for _, name := range slices.Sorted(maps.Keys(damaged)) {
			fmt.Fprintf(w, "%s  DAMAGED: %s\n", name, scheduler.OneLine(damaged[name], 300))
		}
	}

	fmt.Fprintln(w, "\nRUNS")
	views := runViews(states, snap)
	fromStore := stored.read(ctx, len(views))
	printRunLines(w, views, fromStore, now, "no training runs (start one with 'sched enqueue train <run>')")
	refused = cmp.Or(refused, keysRefused(fromStore.err))

	var fails []scheduler.TaskStatus
	for _, f := range snap.Failures(now.Add(-failureWindow)) {
		if setBack(f) == "" {
			fails = append(fails, f)
		}
	}
	printFailures(w, fails)
	return refused
}

// keysRefusedError is the error of `sched status` and `sched runs` where
// object storage refused the credentials they read it with (err): what
// they print is whole but for what only object storage holds, which a
// line of theirs says was not read and why, and they exit 2, as every
// command does that meets wrong credentials. A store that does not
// answer is an outage, not the configuration's mistake: they say so in
// that line, and exit 0.
type keysRefusedError struct{ err error }

func (e keysRefusedError) Error() string {
	return "object storage refused the credentials, so what only it holds is not shown above: " + scheduler.OneLine(e.err.Error(), 400)
}
func (e keysRefusedError) Unwrap() error  { return e.err }
func (e keysRefusedError) BadInput() bool { return true }

// keysRefused is keysRefusedError of err where err is object storage's
// refusal of the credentials (store.KeysRefused), else nil.
func keysRefused(err error) error {
	if store.KeysRefused(err) == "" {
		return nil
	}
	return keysRefusedError{err}
}

// redisFullLine is status's first line where Redis refuses writes for
// memory: what that stops, that nothing is lost, and what to do.
func redisFullLine(m redismem.Memory) string {
	return fmt.Sprintf("REDIS IS FULL: it uses %s, over its maxmemory of %s, and refuses every write (new tasks, progress, the workers' heartbeats): "+
		"the work waits, losing nothing, and which workers run is unknown (a task may read 'worker lost'); to go on, %s",
		formatBytes(m.Used-m.NotCounted), formatBytes(m.Max), redismem.Remedy)
}

// failuresShown is how many of the last hour's failures status lists: a
// cause that fails every file of an ingest (credentials, a gated dataset)
// fails thousands of tasks, which would bury the rest of the report.
const failuresShown = 10

// printFailures lists the newest of fails (newest first) and says how many
// more there are and where to read them.
func printFailures(w io.Writer, fails []scheduler.TaskStatus) {
	fmt.Fprintln(w, "\nFAILURES in the last hour")
	if len(fails) == 0 {
		fmt.Fprintln(w, "none")
	}
	for _, f := range fails[:min(len(fails), failuresShown)] {
		fmt.Fprintln(w, failureLine(f))
	}
	if more := len(fails) - failuresShown; more > 0 {
		fmt.Fprintf(w, "and %d more in the last hour: 'sched runs --limit N' lists the N tasks that ended last\n", more)
	}
}

// waitingShown is how many waiting tasks status lists: an outage of the
// object store sets back every task that meets it.
const waitingShown = 10

// printWaiting lists the tasks set back to wait (setBack "waiting": for
// the object store to answer or to take the worker's keys, for a
// tokenizer, for a store's ingest), newest report first, under WAITING,
// and nothing where none waits. They are in asynq's retry state, which
// neither RUNNING nor FAILURES lists. A training segment is left out: its
// run's line in RUNS says what it waits for, in the same words.
func printWaiting(w io.Writer, tasks []scheduler.TaskStatus) {
	var waiting []scheduler.TaskStatus
	for _, t := range tasks {
		if waits(t) && t.Kind != scheduler.KindTrainSegment {
			waiting = append(waiting, t)
		}
	}
	if len(waiting) == 0 {
		return
	}
	sort.SliceStable(waiting, func(i, j int) bool { return waiting[i].Progress.Updated.After(waiting[j].Progress.Updated) })
	fmt.Fprintln(w, "\nWAITING (no retry used)")
	for _, t := range waiting[:min(len(waiting), waitingShown)] {
		fmt.Fprintln(w, waitingLine(t))
	}
	if more := len(waiting) - waitingShown; more > 0 {
		fmt.Fprintf(w, "and %d more waiting: 'sched runs --limit N' lists them among the N tasks that ended or were set back last\n", more)
	}
}

// waitingLine is one waiting task: id, what it works on, what it waits
// for (kiln's own words, which end with what to do, whole), and when its
// worker found that and when it looks again.
func waitingLine(t scheduler.TaskStatus) string {
	parts := []string{t.ID, "waiting"}
	if s := scheduler.Subject(t.Kind, t.Payload); s != "" {
		parts = append(parts, s)
	}
	parts = append(parts, errorLine(t.Progress.Message, taskErrRunes), waitNote(t))
	return strings.Join(parts, "  ")
}

// Of a task whose last attempt failed, its line says the error, its lines
// joined: cut at listErrRunes where status lists tasks, whole where it
// shows the one task asked for.
const (
	listErrRunes = 200
	taskErrRunes = 1 << 16
)

// taskLine is one task: id, state, then what its progress says. A
// training segment's ETA is its run's (tokens left over the measured
// rate); a task whose worker is lost shows that, and no rate or ETA. A
// task set back (setBack) reads what set it back, "waiting" as WAITING
// lists it or "interrupted" by its worker's shutdown, with when it runs
// again, not asynq's state, "retry", which a failed attempt's task reads
// too: none of its attempts failed.
func taskLine(ts scheduler.TaskStatus, runs map[string]scheduler.RunState, now time.Time, bars bool, errRunes int) string {
	parts := []string{ts.ID, stateShown(ts)}
	// A task sched cancel archived says what became of it in its own
	// words (cancelledNote), not as a failure: asynq's last error of a
	// task stopped as it ran is the stop's "context canceled".
	cancelled := ts.State == "archived" && ts.Cancelled
	failed := ts.LastErr != "" && failedLast(ts) && !cancelled
	if ts.Lost {
		parts[1] = "worker lost"
		if s := scheduler.Subject(ts.Kind, ts.Payload); s != "" {
			parts = append(parts, s)
		}
		if ts.HasProgress && !ts.Progress.Updated.IsZero() {
			parts = append(parts, "last report "+formatAge(ts.Progress.Updated, now))
		}
		parts = append(parts, lostDetail(ts))
		return strings.Join(parts, "  ")
	}
	if ts.HasProgress {
		p := ts.Progress
		eta := p.ETA
		// A task reports as it goes (a segment every logged step): one
		// silent for minutes is in a long quiet phase, or stuck (a GPU
		// that hangs ends its process after KILN_CUDA_HANG_TIMEOUT), and
		// the rate and ETA of its last report say nothing of now.
		quiet := ts.State == "active" && !p.Updated.IsZero() && now.Sub(p.Updated) >= scheduler.Quiet
		finishing := ""
		if ts.Kind == scheduler.KindTrainSegment {
			eta = 0
			if a, err := scheduler.DecodeTask[scheduler.TrainSegment](ts.Payload); err == nil {
				if rs, ok := runs[a.Run]; ok && !rs.Done && rs.Finishing() != "" {
					// Its training is over: the rate of its last steps
					// says nothing of what it waits for.
					p.Rate, finishing = 0, "training is over: "+rs.Finishing()
				} else if ok && !rs.Done {
					var measured bool
					if eta, measured = runETA(rs); measured {
						// The rate the ETA is of, as the run's line
						// says it: the two agree.
						p.Rate, p.Unit = rs.TokPerS, "tok"
					}
				}
			}
		}
		if p.Fraction >= 0 {
			pct := fmt.Sprintf("%.1f%%", 100*p.Fraction)
			if bars && ts.State == "active" {
				pct = bar(p.Fraction, 24) + " " + pct
			}
			parts = append(parts, pct)
		}
		if p.Rate > 0 && ts.State == "active" && !quiet {
			parts = append(parts, formatRate(p.Rate, p.Unit))
		}
		if eta > 0 && ts.State == "active" && !quiet {
			parts = append(parts, "ETA "+formatETA(eta))
		}
		if finishing != "" && ts.State == "active" {
			parts = append(parts, finishing)
		}
		// A failed attempt's message is its error, which "last error"
		// says once below.
		if p.Message != "" && !cancelled && !(failed && p.State == "failed" && sameError(p.Message, ts.LastErr)) {
			parts = append(parts, fmt.Sprintf("%q", p.Message))
		}
		switch setBack(ts) {
		case "waiting":
			parts = append(parts, waitNote(ts))
		case "interrupted":
			parts = append(parts, rerunNote(ts, now))
		}
		if p.Worker != "" && ts.State == "active" {
			parts = append(parts, "on "+p.Worker)
		}
		if quiet {
			parts = append(parts, "last report "+formatAge(p.Updated, now))
		}
	} else if s := scheduler.Subject(ts.Kind, ts.Payload); s != "" {
		parts = append(parts, s)
	}
	if failed {
		parts = append(parts, "last error: "+errorLine(ts.LastErr, errRunes)+spentNote(ts))
	}
	if cancelled {
		parts = append(parts, cancelledNote(ts, now, errRunes))
		if e := errorBeforeCancel(ts); e != "" {
			parts = append(parts, "last error before the cancel: "+errorLine(e, errRunes))
		}
	}
	return strings.Join(parts, "  ")
}

// cancelledNote says what became of a task that sched cancel archived, in
// one clause that ends with what runs it again (scheduler.RedoCancelled),
// cut to about n runes: the worker's own words once its handler returned
// (where it stopped, what a process killed at the grace lost); while its
// handler still stops (its progress reads running), that it does; where
// it never ran, or an older worker said nothing of use, that the cancel
// archived it.
func cancelledNote(ts scheduler.TaskStatus, now time.Time, n int) string {
	redo := scheduler.RedoCancelled(ts.Kind, ts.ID, ts.Payload)
	if ts.HasProgress {
		p := ts.Progress
		msg := errorLine(p.Message, taskErrRunes)
		switch {
		case p.State == "running":
			// asynq lets go of a task as soon as its context ends; the
			// handler reaches its safe point after.
			stops := "its worker stops it at its next safe point"
			if ts.Kind == scheduler.KindTrainSegment {
				stops = "its worker stops it at the end of the step under way, and writes that step's checkpoint if the step ends within the worker's grace (KILN_SHUTDOWN_GRACE), else kills it, losing the steps since its last checkpoint"
			}
			when := ""
			if !p.Updated.IsZero() {
				when = " (" + formatAge(p.Updated, now) + ")"
			}
			return fmt.Sprintf("%s, and not stopped yet at its last report%s: %s; %s", scheduler.CancelledBy, when, stops, redo)
		case strings.HasPrefix(msg, scheduler.CancelledBy) && strings.HasSuffix(msg, "; "+redo):
			return keepRemedy(msg, n, ts.ID)
		}
	}
	return scheduler.CancelledBy + "; " + redo
}

// errorBeforeCancel is the error of a cancelled task's attempt that
// failed before the cancel withdrew it from its wait to retry; "" where
// its last error is the cancel's (the stop's "context canceled", or the
// worker's words), or a wait or an interruption, which no attempt failed.
func errorBeforeCancel(ts scheduler.TaskStatus) string {
	e := strings.TrimSpace(ts.LastErr)
	switch {
	case e == "" || e == context.Canceled.Error() || strings.HasPrefix(e, scheduler.CancelledBy):
		return ""
	case ts.HasProgress && (ts.Progress.State == "interrupted" || ts.Progress.State == "waiting"):
		return ""
	}
	return e
}

// sameError reports whether a progress message and asynq's last error
// say the same, as they do of an attempt that failed: the worker writes
// the error as the message, and asynq keeps it with its own marks.
func sameError(msg, lastErr string) bool {
	return errorLine(msg, len(msg)+1) == errorLine(lastErr, len(lastErr)+1)
}

// errorLine is an error of several lines (errors.Join's) as one, its lines
// joined by "; ", cut at n characters.
func errorLine(err string, n int) string {
	return scheduler.OneLine(strings.ReplaceAll(strings.TrimSpace(err), "\n", "; "), n)
}

// failedLast reports whether a task is where it is because its last
// attempt failed, so that its last error explains it: waiting to retry,
// archived, or queued again after a failure. A task that runs now or
// completed is not; nor is one its worker's shutdown set back or one that
// waits for earlier work (setBack), whose last "error" said so and whose
// progress message still does.
func failedLast(ts scheduler.TaskStatus) bool {
	switch ts.State {
	case "archived":
		return true
	case "retry":
		return setBack(ts) == ""
	case "pending", "scheduled":
		return ts.Retried > 0 && setBack(ts) == ""
	}
	return false
}

// setBack says why a task waits in the queue although no attempt of it
// failed, as its worker last reported: "interrupted" (the worker's
// shutdown stopped it at a safe point; it runs again without using a
// retry) or "waiting" (for earlier work: a tokenizer, a store's ingest);
// "" otherwise. asynq keeps both in its retry state, beside failures.
func setBack(ts scheduler.TaskStatus) string {
	switch ts.State {
	case "retry", "pending", "scheduled":
		if ts.HasProgress && (ts.Progress.State == "interrupted" || ts.Progress.State == "waiting") {
			return ts.Progress.State
		}
	}
	return ""
}

// waits reports whether a task is set back to wait for something (the
// object store to answer or to take the worker's keys, a tokenizer, a
// store's ingest) rather than for its next try after a failure: the one
// test of whether status lists it under WAITING, as setBack is of whether
// its line and sched runs' read "waiting" (stateShown).
func waits(ts scheduler.TaskStatus) bool { return setBack(ts) == "waiting" }

// stateShown is a task's state as status and runs say it: what set it
// back where something did (setBack: "waiting", "interrupted"), asynq's
// state otherwise. asynq holds a task set back in its retry state, beside
// those whose attempt failed, and a user reads "retry" as a failure.
func stateShown(ts scheduler.TaskStatus) string {
	if back := setBack(ts); back != "" {
		return back
	}
	return ts.State
}

// rerunNote says when a task its worker's shutdown interrupted runs again:
// at once, without using a retry, once a worker on its queue takes it
// (asynq's retry state holds it until a worker moves it back to its
// queue; none may run now).
func rerunNote(ts scheduler.TaskStatus, now time.Time) string {
	if ts.State == "retry" && ts.NextRun.After(now) {
		return "it runs again at " + ts.NextRun.UTC().Format(time.RFC3339) + " (no retry used)"
	}
	return "it runs again once a worker on queue " + ts.Queue + " takes it (no retry used)"
}

// waitNote says when a waiting task's worker found what the task waits
// for, and when the task looks again: the report is its last try's, and
// the work it waited for may have finished since (an ingest's last tasks),
// which only its next try sees.
func waitNote(ts scheduler.TaskStatus) string {
	note := "as of its last try"
	if !ts.Progress.Updated.IsZero() {
		note += " at " + ts.Progress.Updated.UTC().Format(time.RFC3339)
	}
	if ts.State == "pending" || ts.NextRun.IsZero() {
		return note + "; it looks again once a worker on queue " + ts.Queue + " takes it"
	}
	return note + "; it looks again at " + ts.NextRun.UTC().Format(time.RFC3339)
}

// datasetLine is one store's ingest: files done of total, bytes, tokens,
// rate and ETA, and why it is not moving when it is not; deletedAt is
// when the worker holding the stores found d's store gone from its disk
// (zero: never), which an ingest ended before it no longer holds.
func datasetLine(d scheduler.DatasetProgress, snap *scheduler.Snapshot, deletedAt time.Time) string {
	name := d.Store
	if len(d.Datasets) > 1 || len(d.Datasets) == 1 && d.Datasets[0] != d.Store {
		name += " (" + strings.Join(d.Datasets, ", ") + ")"
	}
	if !deletedAt.IsZero() && !d.Planning && d.Running == 0 && d.Retrying == 0 && d.Waiting == 0 && !d.Last.After(deletedAt) {
		// The tasks' history outlives the store: what they appended went
		// with it.
		return fmt.Sprintf("%s  its store was deleted from the disk at %s, after this ingest: enqueue the ingest again to fill it",
			name, deletedAt.UTC().Format(time.RFC3339))
	}
	if d.Files == 0 && d.PlanDone && !d.PlanStopped {
		// A plan that listed files and queued none: the store holds them
		// all ('sched datasets' says how much that is).
		return name + "  nothing to ingest: the store holds every file its latest plan listed"
	}
	planEnd := ""
	if p := d.LastPlan; p != nil && p.State == "archived" {
		if d.Files == 0 {
			// No count to give: "files 0/0 done" read as an ingest done.
			return name + "  " + planEnded(p, false)
		}
		// The files it queued before its end go on; those it had not
		// listed yet are in no task.
		planEnd = planEnded(p, true)
	}
	parts := []string{name, fmt.Sprintf("files %d/%d done", d.Done, d.Files)}
	if d.NoPlan {
		// Not the dataset's count: its plan's record is gone.
		parts[1] += " of those Redis holds"
	}
	if d.SizesKnown && d.Bytes > 0 {
		parts = append(parts, formatBytes(d.DoneBytes)+" of "+formatBytes(d.Bytes))
	}
	if d.Tokens > 0 {
		parts = append(parts, formatCount(d.Tokens, "tok"))
	}
	if d.Rate > 0 {
		if d.SizesKnown {
			parts = append(parts, formatRate(d.Rate, "B"))
		} else {
			parts = append(parts, formatRate(d.Rate, "files"))
		}
	}
	switch {
	case d.Planning && d.PlanWaits != "":
		parts = append(parts, "planning, "+scheduler.OneLine(d.PlanWaits, 200))
	case d.Planning:
		parts = append(parts, "planning: more files may be queued")
	case d.Remaining() == 0 && d.Failed == 0 && (d.Stopped > 0 || d.PlanStopped):
		// The end the user sized the store for, not a failure.
		parts = append(parts, "stopped at "+formatLimits(d.StoppedAt))
	case d.Files > 0 && d.Remaining() == 0 && d.Failed == 0 && !d.NoPlan && planEnd == "":
		parts = append(parts, "done")
	case d.ETA > 0:
		parts = append(parts, "ETA "+formatETA(d.ETA))
	}
	var notes []string
	if d.Running > 0 {
		notes = append(notes, fmt.Sprintf("%d running", d.Running))
	}
	if d.Lost > 0 {
		notes = append(notes, fmt.Sprintf("%d on a lost worker (they run again once a worker recovers them)", d.Lost))
	}
	if d.Retrying > 0 {
		notes = append(notes, fmt.Sprintf("%d retrying after a failed attempt (FAILURES says why)", d.Retrying))
	}
	if d.Waiting > 0 {
		notes = append(notes, fmt.Sprintf("%d waiting", d.Waiting))
		for _, q := range []string{scheduler.QueueIngest, scheduler.QueueAppend} {
			// While Redis is full no worker's heartbeat says which
			// queues it serves (the line at the top says so).
			if !snap.Serves(q) && !snap.RedisFull() {
				notes = append(notes, "no worker serves queue "+q)
			}
		}
	}
	if n := skippedFiles(d.Skipped); n != "" {
		// Done, and not in the store: a file of one too-large document,
		// corrupt, not UTF-8. The bytes above were read, not stored.
		notes = append(notes, n)
	}
	if d.Stopped > 0 {
		// An append that reached the limit took its file's leading
		// documents that fit; the task says which.
		notes = append(notes, fmt.Sprintf("%d left out or taken in part at %s (raise it and enqueue the ingest again for the rest)", d.Stopped, formatLimits(d.StoppedAt)))
	}
	if d.Failed > 0 {
		notes = append(notes, fmt.Sprintf("%d failed (see FAILURES and 'sched runs')", d.Failed))
	}
	if len(notes) > 0 {
		parts = append(parts, strings.Join(notes, ", "))
	}
	if planEnd != "" {
		parts = append(parts, planEnd)
	}
	return strings.Join(parts, "  ")
}

// planEnded says of a store's latest plan p, archived (failed for good,
// or cancelled by sched cancel), that it ended so and what queues it
// again, for the store's INGEST line, which then never reads done:
// queued (it queued some files first, which go on) says that those it
// had not queued yet are not ingested, and that the retry queues only
// those the store lacks.
func planEnded(p *scheduler.TaskStatus, queued bool) string {
	how, why := "was cancelled by sched cancel", ""
	if !p.Cancelled {
		how, why = "failed", " ('sched status "+p.ID+"' says why)"
	}
	if !queued {
		return fmt.Sprintf("its plan %s %s before it queued a file%s: 'sched retry %s' queues it again", p.ID, how, why, p.ID)
	}
	return fmt.Sprintf("its plan %s %s%s, so any files it had not queued yet are not ingested: 'sched retry %s' queues those the store lacks, none twice", p.ID, how, why, p.ID)
}

// skippedFiles says how many of a store's done files were skipped whole, by
// reason: "1 skipped, not in the store (too-large=1; 'sched datasets'
// says why)"; "" where none was.
func skippedFiles(by map[string]int) string {
	n := 0
	var reasons []string
	for r, c := range by {
		n += c
		reasons = append(reasons, fmt.Sprintf("%s=%d", r, c))
	}
	if n == 0 {
		return ""
	}
	sort.Strings(reasons)
	return fmt.Sprintf("%d skipped, not in the store (%s; 'sched datasets' says why)", n, strings.Join(reasons, ", "))
}

// formatLimits names an ingest's limits as they are typed: "--max-tokens
// 300K", "--max-disk 50G".
func formatLimits(l ingest.Limits) string {
	var out []string
	if l.MaxTokens > 0 {
		out = append(out, "--max-tokens "+formatLimit(l.MaxTokens, []limitUnit{{1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}}))
	}
	if l.MaxDisk > 0 {
		out = append(out, "--max-disk "+formatLimit(l.MaxDisk, []limitUnit{{1 << 40, "T"}, {1 << 30, "G"}, {1 << 20, "M"}, {1 << 10, "K"},
			{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}}))
	}
	if len(out) == 0 {
		return "its limit"
	}
	return strings.Join(out, " or ")
}

type limitUnit struct {
	size   int64
	suffix string
}

// formatLimit writes n as parseCount and parseBytes read it back, in the
// shortest of its forms: whole, or in a unit that holds it to three
// decimals exactly (the first of units on a tie). 300000 tokens are
// "300K", 1500000000 "1.5B"; 150000 bytes "150KB", 50 x 2^30 "50G".
func formatLimit(n int64, units []limitUnit) string {
	best := strconv.FormatInt(n, 10)
	for _, u := range units {
		if n >= u.size && n%u.size*1000%u.size == 0 {
			if f := strconv.FormatFloat(float64(n)/float64(u.size), 'f', -1, 64) + u.suffix; len(f) < len(best) {
				best = f
			}
		}
	}
	return best
}

// failureLine is one failure: when, what, and the first line of why.
func failureLine(t scheduler.TaskStatus) string {
	what := "failed for good (archived)"
	if t.State == "retry" {
		// Counted as sched runs counts it: the attempts, the first one
		// included, where asynq counts the retries.
		what = fmt.Sprintf("failed (attempt %d of %d), retries at %s", t.Retried, t.MaxRetry+1, t.NextRun.Local().Format("15:04:05"))
	}
	subject := scheduler.Subject(t.Kind, t.Payload)
	if subject == "" {
		subject = t.Kind
	}
	return fmt.Sprintf("%s  %s  %s  %s: %s", t.LastFailed.Local().Format("15:04:05"), t.ID, subject, what, failureErr(t, listErrRunes)+spentNote(t))
}

// spentNote is, for a task archived as its last attempt failed, its
// retries spent, what runs it again once the cause is mended, as a clause
// to add after its error ("" for any other task): the error says what to
// mend, for an attempt to come, where a cancelled task's line says what
// resumes it. A training segment's run resumes from its last checkpoint
// (docs/operations.md, "Resuming").
func spentNote(t scheduler.TaskStatus) string {
	if !retriesSpent(t) {
		return ""
	}
	return "; once that is mended, " + scheduler.RedoCancelled(t.Kind, t.ID, t.Payload)
}

// retriesSpent reports whether t was archived as its last attempt failed:
// not cancelled, and its retries all used (a failure that no retry mends,
// archived at once, says what to do in its own words).
func retriesSpent(t scheduler.TaskStatus) bool {
	return t.State == "archived" && !t.Cancelled && t.MaxRetry > 0 && t.Retried >= t.MaxRetry
}

// failureErr is a task's last error as every one-line view says it
// (FAILURES, sched runs, a run's line), cut to about n runes. Kiln's
// errors end with what to do, after their last "; "
// ("...; enqueue the ingest again ('sched enqueue ingest'), which makes it
// again") or, in one without, their last ": " ("...below min_free_disk
// 40.0 TiB: free space on that disk, or lower min_free_disk in a runs
// file"), which a cut at n would drop: a longer one keeps that last
// clause whole after the cut, and one whose last clause would take most of
// the line says where it is read whole ('sched status <task-id>').
func failureErr(t scheduler.TaskStatus, n int) string {
	return keepRemedy(scheduler.OneLine(t.LastErr, taskErrRunes), n, t.ID)
}

// keepRemedy is msg, one line, cut to about n runes as failureErr cuts
// task id's error: its last clause, what to do (remedyAt), kept whole, and
// a parenthesis the cut leaves open closed.
func keepRemedy(msg string, n int, id string) string {
	if utf8.RuneCountInString(msg) <= n {
		return msg
	}
	if i, sep := remedyAt(msg); i >= 0 {
		tail := msg[i+len(sep):]
		if head := n - utf8.RuneCountInString(tail) - 3; head >= n/3 {
			kept := string([]rune(msg[:i])[:head])
			// A parenthesis the cut leaves open is closed after it.
			return kept + "…" + strings.Repeat(")", max(strings.Count(kept, "(")-strings.Count(kept, ")"), 0)) + sep + tail
		}
	}
	return scheduler.OneLine(msg, n) + " ('sched status " + id + "' says it whole)"
}

// remedyAt is where msg's last clause, what to do, begins (-1 where it
// has none), and the separator before it: its last "; ", or, in a message
// with none, its last ": ". One inside parentheses is another error's,
// quoted in msg, and separates none of msg's clauses (a wait for a runs
// file that does not read ends "(runs file ...: line 122: mapping key
// ...): mend it on the worker, and ..."); where msg's parentheses do not
// pair up, its last "; " anywhere is taken, as it was before parentheses
// were counted.
func remedyAt(msg string) (int, string) {
	semi, colon, depth := -1, -1, 0
	// Every byte is read, the last too: a ")" that ends msg closes its
	// parenthesis, or the "; " inside it would be taken for msg's own.
	for i := 0; i < len(msg); i++ {
		switch {
		case msg[i] == '(':
			depth++
		case msg[i] == ')':
			depth = max(depth-1, 0)
		case depth > 0 || i+1 == len(msg) || msg[i+1] != ' ':
		case msg[i] == ';':
			semi = i
		case msg[i] == ':':
			colon = i
		}
	}
	switch {
	case depth == 0 && semi >= 0:
		return semi, "; "
	case depth == 0 && colon >= 0:
		return colon, ": "
	}
	if i := strings.LastIndex(msg, "; "); i >= 0 {
		return i, "; "
	}
	return -1, ""
}
