package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/redismem"
)

// Snapshot is every kiln task in the queues, with its last progress, and
// the worker processes that heartbeat, read in one pass so that the
// figures `sched status` derives from it (running tasks, datasets,
// failures, runs) agree with one another.
type Snapshot struct {
	// At is when the snapshot was read; ages and rates are measured to it.
	At     time.Time
	Queues []QueueStatus
	// Tasks holds the tasks of every state and queue.
	Tasks []TaskStatus
	// Workers are the worker processes whose heartbeat is current.
	Workers []WorkerProcess
	// Memory is Redis's memory as the snapshot was read (INFO memory);
	// zero where Redis did not say (RedisFull).
	Memory redismem.Memory
}

// RedisFull reports whether Redis refused writes for memory as the
// snapshot was read. A worker's heartbeat is a write: then Workers lacks
// the workers whose last heartbeat has lapsed although they run, and a
// queue no listed worker serves may be served all the same.
func (s *Snapshot) RedisFull() bool { return s != nil && s.Memory.Full() }

// WorkerProcess is one worker process: asynq runs a server per queue in it
// (worker.New), all sharing the process's host and pid.
type WorkerProcess struct {
	// Name is host:pid, the name the process writes in progress records.
	Name string
	// Queues maps each queue the process serves to its concurrency.
	Queues map[string]int
	// Active is the number of this snapshot's running tasks that are its.
	Active  int
	Started time.Time
}

// snapshotPage is how many tasks one inspector call lists.
const snapshotPage = 1000

// allPages is every task list gives for queue q, read a page at a time.
func allPages(list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error), q string) ([]*asynq.TaskInfo, error) {
	var infos []*asynq.TaskInfo
	for page := 1; ; page++ {
		tis, err := list(q, asynq.PageSize(snapshotPage), asynq.Page(page))
		if err != nil {
			return nil, fmt.Errorf("tasks of queue %s: %w", q, err)
		}
		infos = append(infos, tis...)
		if len(tis) < snapshotPage {
			return infos, nil
		}
	}
}

// Snapshot reads every task and live worker. Completed tasks are kept for
// their kind's retention, so a large ingest lists thousands; they are read
// in pages, and their progress records with one MGET per page. Its cost
// grows with them: about 1.1 KB read from Redis and 6 KB allocated per
// task kept (0.34 s at 20,000: BenchmarkSnapshotOfALargeIngest).
func (c *Client) Snapshot(ctx context.Context) (*Snapshot, error) {
	return c.SnapshotOf(ctx, Queues...)
}

// SnapshotOf is Snapshot of queues alone (its Queues and Tasks are
// theirs), and every live worker: the gpu queue's, say, which a week of a
// large ingest's tasks does not slow.
func (c *Client) SnapshotOf(ctx context.Context, queues ...string) (*Snapshot, error) {
	s := &Snapshot{At: time.Now()}
	known, err := c.shownQueues()
	if err != nil {
		return nil, err
	}
	type lister func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	for _, q := range Queues {
		if !slices.Contains(queues, q) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		qs := QueueStatus{Name: q}
		if !known[q] {
			s.Queues = append(s.Queues, qs)
			continue
		}
		info, err := c.insp.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("status of queue %s: %w", q, err)
		}
		qs.Pending, qs.Active, qs.Scheduled = info.Pending, info.Active, info.Scheduled
		qs.Retry, qs.Archived, qs.Completed, qs.Paused = info.Retry, info.Archived, info.Completed, info.Paused
		qs.Size = qs.Pending + qs.Active + qs.Scheduled + qs.Retry
		// The lists of live work (liveLists), with those a running task
		// ends in before pending and active are read again at their end:
		// a task that moves while they are read is found at a later read,
		// and one found twice is taken as the last read found it. Read
		// active before pending, a shard that started in between was
		// missed, and its file, with no shard and no append, read as one
		// its shard had found in the store: done; read without the last
		// two, a plan that ended while they were read showed without the
		// shard it had queued ("nothing to ingest"), and a segment without
		// its next (the run "stopped").
		var infos []*asynq.TaskInfo
		lists := c.liveLists()
		lists = slices.Insert(lists, len(lists)-2, liveList{c.insp.ListArchivedTasks, "archived"}, liveList{c.insp.ListCompletedTasks, "completed"})
		for _, l := range lists {
			tis, err := allPages(l.list, q)
			if err != nil {
				return nil, err
			}
			infos = append(infos, tis...)
			if c.listed != nil {
				c.listed(q, l.state)
			}
		}
		tasks, err := c.taskStatuses(ctx, lastRead(infos))
		if err != nil {
			return nil, err
		}
		for _, ts := range tasks {
			if ts.State == "active" {
				qs.Running = append(qs.Running, ts)
			}
		}
		s.Tasks = append(s.Tasks, tasks...)
		s.Queues = append(s.Queues, qs)
	}
	servers, err := c.insp.Servers()
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	s.Workers = workerProcesses(servers)
	// A Redis that does not answer INFO (a managed one that renames or
	// forbids it) leaves Memory zero, and its refusals, where it is
	// full, unexplained here; the rest of the snapshot stands.
	if m, err := redismem.Read(ctx, c.rdb); err == nil {
		s.Memory = m
	}
	s.markLost(servers)
	s.countActive(servers)
	for i := range s.Queues {
		for j := range s.Queues[i].Running {
			s.Queues[i].Running[j] = s.task(s.Queues[i].Running[j].ID)
		}
	}
	return s, nil
}

// lastRead is infos with each task once, as its last read found it, in the
// order of those reads.
func lastRead(infos []*asynq.TaskInfo) []*asynq.TaskInfo {
	last := make(map[string]int, len(infos))
	for i, ti := range infos {
		last[ti.ID] = i
	}
	out := infos[:0:0]
	for i, ti := range infos {
		if last[ti.ID] == i {
			out = append(out, ti)
		}
	}
	return out
}

// taskStatuses converts infos, reading their progress records and, for
// archived tasks, their cancel marks in one round trip each.
func (c *Client) taskStatuses(ctx context.Context, infos []*asynq.TaskInfo) ([]TaskStatus, error) {
	ids := make([]string, len(infos))
	for i, ti := range infos {
		ids[i] = ti.ID
	}
	progress, err := ReadProgressMany(ctx, c.rdb, ids)
	if err != nil {
		return nil, err
	}
	out := make([]TaskStatus, len(infos))
	var marked []int
	for i, ti := range infos {
		out[i] = newTaskStatus(ti)
		if p, ok := progress[ti.ID]; ok {
			out[i].Progress, out[i].HasProgress = p, true
		}
		// A running task may carry a cancel too: one whose worker died
		// is archived, not run, by the worker that takes it back.
		if ti.State == asynq.TaskStateArchived || ti.State == asynq.TaskStateActive {
			marked = append(marked, i)
		}
	}
	if len(marked) > 0 {
		pipe := c.rdb.Pipeline()
		marks := make([]*redis.StringCmd, len(marked))
		for k, i := range marked {
			marks[k] = pipe.Get(ctx, cancelKey(out[i].ID))
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read cancel marks: %w", err)
		}
		for k, i := range marked {
			if out[i].State == "active" {
				out[i].Cancelled = marks[k].Val() != ""
				continue
			}
			markCancelled(&out[i], marks[k].Val())
		}
	}
	return out, nil
}

func workerProcesses(servers []*asynq.ServerInfo) []WorkerProcess {
	byName := map[string]*WorkerProcess{}
	for _, s := range servers {
		name := s.Host + ":" + strconv.Itoa(s.PID)
		wp := byName[name]
		if wp == nil {
			wp = &WorkerProcess{Name: name, Queues: map[string]int{}, Started: s.Started}
			byName[name] = wp
		}
		for q := range s.Queues {
			wp.Queues[q] += s.Concurrency
		}
		if s.Started.Before(wp.Started) {
			wp.Started = s.Started
		}
	}
	out := make([]WorkerProcess, 0, len(byName))
	for _, wp := range byName {
		out = append(out, *wp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// markLost flags running tasks whose worker is gone. asynq says so itself
// once the task's lease has lapsed (IsOrphaned, 30s after the last
// renewal); sooner than that, a task no live server lists as its own,
// whose progress record names a worker process that no longer heartbeats
// (asynq drops a server 10s after its last heartbeat), is lost too. A task
// just taken by a live worker is listed by its server within a heartbeat
// (5s) and its record names that live process, so it never reads as lost.
func (s *Snapshot) markLost(servers []*asynq.ServerInfo) {
	live := map[string]bool{}
	held := map[string]bool{}
	for _, sv := range servers {
		live[sv.Host+":"+strconv.Itoa(sv.PID)] = true
		for _, w := range sv.ActiveWorkers {
			held[w.TaskID] = true
		}
	}
	for i := range s.Tasks {
		t := &s.Tasks[i]
		if t.State != "active" {
			continue
		}
		t.WorkerLive = t.HasProgress && live[t.Progress.Worker]
		t.Lost = t.Orphaned || (!held[t.ID] && t.HasProgress && t.Progress.Worker != "" && !t.WorkerLive)
	}
}

// countActive sets each worker's Active to the tasks of this snapshot's
// RUNNING that are its: those whose progress names it, and those its
// heartbeat lists that have no progress yet. The heartbeat alone, written
// every 5s, would count a task just started as not yet running and one
// just finished as running still.
func (s *Snapshot) countActive(servers []*asynq.ServerInfo) {
	heldBy := map[string]string{}
	for _, sv := range servers {
		for _, w := range sv.ActiveWorkers {
			heldBy[w.TaskID] = sv.Host + ":" + strconv.Itoa(sv.PID)
		}
	}
	n := map[string]int{}
	for _, t := range s.Tasks {
		switch {
		case t.State != "active":
		case t.HasProgress && t.Progress.Worker != "":
			n[t.Progress.Worker]++
		case heldBy[t.ID] != "":
			n[heldBy[t.ID]]++
		}
	}
	for i := range s.Workers {
		s.Workers[i].Active = n[s.Workers[i].Name]
	}
}

func (s *Snapshot) task(id string) TaskStatus {
	for _, t := range s.Tasks {
		if t.ID == id {
			return t
		}
	}
	return TaskStatus{ID: id}
}

// Running returns the active tasks, lost ones included (their Lost set).
func (s *Snapshot) Running() []TaskStatus {
	var out []TaskStatus
	for _, t := range s.Tasks {
		if t.State == "active" {
			out = append(out, t)
		}
	}
	return out
}

// Failures returns the failures since the given time, newest first: tasks
// archived for good and tasks waiting to retry, each with its last error.
// A cancelled task is not a failure and is left out.
func (s *Snapshot) Failures(since time.Time) []TaskStatus {
	var out []TaskStatus
	for _, t := range s.Tasks {
		if (t.State == "archived" || t.State == "retry") && !t.Cancelled && !t.LastFailed.Before(since) && !t.LastFailed.IsZero() {
			out = append(out, t)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].LastFailed.After(out[j].LastFailed) })
	return out
}

// Serves reports whether a live worker process serves queue q.
func (s *Snapshot) Serves(q string) bool {
	for _, w := range s.Workers {
		if w.Queues[q] > 0 {
			return true
		}
	}
	return false
}

// RunTask is the newest train:segment task of a training run.
type RunTask struct {
	Task TaskStatus
	// FromStep is the checkpoint step the segment starts from.
	FromStep int64
	// TotalSteps is the run's length when the segment was queued (0 in a
	// segment queued by a kiln that did not record it).
	TotalSteps int64
}

// RunTasks returns, per training run, its newest segment task: one still
// waiting or running over any finished one (a run is one chain, so there
// is at most one; a run enqueued again after a stop may start from an
// earlier step than a finished segment records), else the one that starts
// from the latest step, and among those the later finish.
func (s *Snapshot) RunTasks() map[string]RunTask {
	out := map[string]RunTask{}
	for _, t := range s.Tasks {
		if t.Kind != KindTrainSegment {
			continue
		}
		a, err := DecodeTask[TrainSegment](t.Payload)
		if err != nil {
			continue
		}
		cur, ok := out[a.Run]
		if !ok || newerSegment(t, a.FromStep, cur.Task, cur.FromStep) {
			out[a.Run] = RunTask{Task: t, FromStep: a.FromStep, TotalSteps: a.TotalSteps}
		}
	}
	return out
}

// newerSegment orders two segment tasks of one run: live before finished,
// then the later starting step, then the later finish.
func newerSegment(a TaskStatus, aFrom int64, b TaskStatus, bFrom int64) bool {
	la, lb := !a.Ended(), !b.Ended()
	switch {
	case la != lb:
		return la
	case aFrom != bFrom:
		return aFrom > bFrom
	}
	return a.Finished.After(b.Finished)
}

// DecodeTask reads a payload of any version-1 envelope into A without the
// policy check Decode makes: the status commands show tasks a newer or
// older build queued, and must not fail on them.
func DecodeTask[A Args](payload []byte) (A, error) {
	var a A
	var env envelope
	if err := json.Unmarshal(payload, &env); err != nil {
		return a, err
	}
	err := json.Unmarshal(env.Args, &a)
	return a, err
}

// Subject names what a task works on, for one-line listings: a run, a
// dataset's file, a store, a tokenizer. Empty when the payload cannot be read.
func Subject(kind string, payload []byte) string {
	switch kind {
	case KindTrainSegment:
		if a, err := DecodeTask[TrainSegment](payload); err == nil {
			// The step it was queued at: a retry resumes from the run's
			// newest checkpoint, which its progress shows.
			return fmt.Sprintf("run %s queued at step %d", a.Run, a.FromStep)
		}
	case KindIngestPlan:
		if a, err := DecodeTask[IngestPlan](payload); err == nil {
			return "plan " + a.Dataset + intoStore(a.Dataset, a.Store)
		}
	case KindIngestShard:
		if a, err := DecodeTask[IngestShard](payload); err == nil {
			return a.Dataset + " " + a.Path + intoStore(a.Dataset, a.Store)
		}
	case KindIngestAppend:
		if a, err := DecodeTask[IngestAppend](payload); err == nil {
			return "append " + a.Source + " to " + a.Store
		}
	case KindTokenizerSample:
		if a, err := DecodeTask[TokenizerSample](payload); err == nil {
			return "tokenizer " + a.Name + " sample " + a.Dataset
		}
	case KindTokenizerTrain:
		if a, err := DecodeTask[TokenizerTrain](payload); err == nil {
			return "tokenizer " + a.Name
		}
	case KindBenchRun:
		if a, err := DecodeTask[BenchRun](payload); err == nil {
			return strings.TrimSpace("bench " + a.Sweep + " " + a.Model)
		}
	}
	return ""
}

// CancelledBy begins what a task that `sched cancel` stopped says of its
// end (the worker writes it as the task's progress message).
const CancelledBy = "cancelled by sched cancel"

// InterruptedBy begins what a task its worker's shutdown stopped says of
// its end (the worker writes it as the task's progress message).
const InterruptedBy = "interrupted by worker shutdown"

// ProcessEndedAtStop says whether msg, what a task said of its end, is a
// stop's (a cancel's or its worker's shutdown) whose task's process
// outlasted the worker's grace and was killed, or died as it stopped:
// what it had not saved, a segment's steps since its last checkpoint, is
// lost, where a stop at a step boundary would have written that step's
// checkpoint.
func ProcessEndedAtStop(msg string) bool {
	return strings.HasPrefix(msg, CancelledBy+": its process ") || strings.HasPrefix(msg, InterruptedBy+": its process ")
}

// RedoCancelled says what runs a task that `sched cancel` archived again,
// or one archived once its retries were spent: a training segment is a
// stretch of its run, which 'sched enqueue train RUN' resumes from its
// last checkpoint, with nothing redone; any other task runs again whole
// with 'sched retry ID'.
func RedoCancelled(kind, id string, payload []byte) string {
	if kind == KindTrainSegment {
		if a, err := DecodeTask[TrainSegment](payload); err == nil && a.Run != "" {
			return "'sched enqueue train " + a.Run + "' resumes the run from its last checkpoint"
		}
	}
	return "'sched retry " + id + "' runs it again"
}

// intoStore names the token store an ingest task fills where it is not
// the one named after its dataset: several stores of one dataset (a store
// for each limit or language) are told apart.
func intoStore(dataset, store string) string {
	if store == "" || store == lastElem(dataset) {
		return ""
	}
	return " into " + store
}

// ansiEscape matches a terminal's colour and cursor sequences, which a
// child's console log line carries into a recorded reason.
var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// OneLine is the first line of an error message, cut to n runes, for a
// listing of one line per failure: without terminal escapes, and without
// the "(skip retry for the task)" that marks an error final for asynq, which
// says nothing to a person (the listing says archived); asynq's lease
// expiry said in words.
func OneLine(msg string, n int) string {
	msg = ansiEscape.ReplaceAllString(msg, "")
	if msg == asynq.ErrLeaseExpired.Error() {
		// asynq's own reason for a task it took back from a worker.
		msg = "its worker stopped answering (killed, or cut off from Redis) until the task's lease expired; asynq queued it again"
	}
	msg = strings.ReplaceAll(msg, " ("+asynq.SkipRetry.Error()+")", "")
	msg, _, _ = strings.Cut(strings.TrimSpace(msg), "\n")
	if r := []rune(msg); len(r) > n {
		msg = string(r[:n-1]) + "…"
	}
	return msg
}
