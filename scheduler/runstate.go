package scheduler

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RunState is a run's progress as its segments record it in Redis (the
// hash at RunStateKey), for `sched status`.
type RunState struct {
	Run         string
	Step, Total int
	Tokens      int64
	// Loss is the training loss of step LossStep, the last logged one
	// that the state records (LossAt): a segment that stopped between two
	// logged steps records the step it stopped at, and the loss of the
	// one logged before it. 0 where the state records none, as one an
	// earlier kiln wrote: the loss is then read as Step's. 0 too where the
	// loss was written after its step by a kiln that records no loss
	// step (a run that an older worker went on with): the step recorded
	// is then another loss's (LossFields).
	Loss     float64
	LossStep int
	// EvalLoss is the last held-out loss (0 none yet).
	EvalLoss float64
	TokPerS  float64
	// GPUs is how many GPUs trained at TokPerS (0 unrecorded: one).
	GPUs int
	// ETA is the time left at the last logged throughput (0 unknown).
	ETA time.Duration
	// Checkpoint is the step of the newest checkpoint marked complete in
	// object storage (-1 none yet), written at CheckpointAt.
	Checkpoint   int
	CheckpointAt time.Time
	// UploadSeconds is how long that checkpoint took to upload.
	UploadSeconds float64
	Worker        string
	Updated       time.Time
	Wall          time.Duration
	Done          bool
	// Seq, Shape and Seed are the sequence length, the model's layout
	// (trainer.Shape) and the seed the run trains with (0, "" and
	// HasSeed false where a state recorded none).
	Seq     int
	Shape   string
	Seed    uint64
	HasSeed bool
	// Phase is where the run's last segment is once its training is over
	// and before it records the run done (PhaseUpload, PhaseResults); ""
	// while it trains, and in a state that records none.
	Phase string
	// Unsent is set while object storage does not take the run's
	// checkpoints; its zero value while it does.
	Unsent Unsent
}

// Unsent is what a segment records in the run's state while object
// storage does not take its checkpoints (it is down, hangs, or refuses
// them): training goes on, and the checkpoints after the state's newest
// uploaded one pile up on its worker's disk, their only copy, where
// nothing else a watcher reads changes but the last checkpoint's falling
// further behind. The upload that next succeeds clears it.
type Unsent struct {
	// Since is when the run's checkpoints stopped reaching object storage
	// (the failed or slow upload's start); zero while they reach it.
	Since time.Time
	// Newest is the step of the newest checkpoint on Worker's disk only.
	Newest int
	Worker string
	// Store is the object store's URL; Err its last failure, in short.
	Store, Err string
}

// LossAt is the step Loss is of: LossStep, or where the state records
// none, Step. A training loss is of a step trained, never of step 0.
func (s RunState) LossAt() int {
	if s.LossStep > 0 {
		return s.LossStep
	}
	return s.Step
}

// LossFields are the fields of the run's state that record loss as step's:
// the loss, its step, and beside the step the loss it is the step of. A
// kiln older than loss_step writes the loss alone, and leaves a later
// kiln's loss_step behind, another loss's step: the state's loss is read
// as that step's only while it is still the one written with it.
func LossFields(loss float64, step int) map[string]string {
	l := strconv.FormatFloat(loss, 'f', 4, 64)
	return map[string]string{"loss": l, "loss_step": strconv.Itoa(step), "loss_step_loss": l}
}

// NoLoss are the fields that clear the run's state's loss, and its step.
func NoLoss() map[string]string {
	return map[string]string{"loss": "", "loss_step": "", "loss_step_loss": ""}
}

// lossStep is the step the state h records its loss as of (LossStep): its
// loss_step, where the loss beside it is still the one it was written
// with (LossFields), or where it records none beside it, as a kiln that
// wrote loss_step alone did; 0 otherwise.
func lossStep(h map[string]string) int {
	if of, ok := h["loss_step_loss"]; ok && of != h["loss"] {
		return 0
	}
	n, _ := strconv.Atoi(h["loss_step"])
	return n
}

// unsentFields are Unsent's fields in the run's state hash.
var unsentFields = [...]string{"unsent_since", "unsent_step", "unsent_worker", "unsent_store", "unsent_error"}

// Fields are u as fields of the run's state, for a fenced write; those of
// the zero Unsent clear it.
func (u Unsent) Fields() map[string]string {
	f := map[string]string{}
	if u.Since.IsZero() {
		for _, k := range unsentFields {
			f[k] = ""
		}
		return f
	}
	for i, v := range []string{u.Since.UTC().Format(time.RFC3339), strconv.Itoa(u.Newest), u.Worker, u.Store, u.Err} {
		f[unsentFields[i]] = v
	}
	return f
}

func parseUnsent(h map[string]string) Unsent {
	since, err := time.Parse(time.RFC3339, h["unsent_since"])
	if err != nil {
		return Unsent{}
	}
	u := Unsent{Since: since, Worker: h["unsent_worker"], Store: h["unsent_store"], Err: h["unsent_error"]}
	u.Newest, _ = strconv.Atoi(h["unsent_step"])
	return u
}

// UnsentNote says where the run's checkpoints are while object storage
// does not take them: "checkpoints after step 200 (newest: step 1000) are
// on gpu-a's disk only: object storage at http://minio:9000/kiln has not
// taken them since 2026-12-07T10:43:38Z (put: connect: connection
// refused)". "" while it takes them, and where the state records the
// newest as uploaded.
func (s RunState) UnsentNote() string {
	u := s.Unsent
	if u.Since.IsZero() || u.Newest <= s.Checkpoint {
		return ""
	}
	which := fmt.Sprintf("checkpoints after step %d (newest: step %d)", s.Checkpoint, u.Newest)
	if s.Checkpoint < 0 {
		which = fmt.Sprintf("its checkpoints (newest: step %d)", u.Newest)
	}
	where := "its worker's disk"
	if u.Worker != "" {
		where = u.Worker + "'s disk"
	}
	store := "object storage"
	if u.Store != "" {
		store += " at " + u.Store
	}
	note := fmt.Sprintf("%s are on %s only: %s has not taken them since %s", which, where, store, u.Since.UTC().Format(time.RFC3339))
	if u.Err != "" {
		// The error's cause in a few words: the one-line views cut a
		// line's reasons, and this one is no reason the run stopped.
		note += " (" + OneLine(u.Err, 100) + ")"
	}
	return note
}

// The phases of a run's last segment between its last step and the run's
// end: it waits for its last checkpoint's upload (minutes on a slow store),
// then writes the run's results. No step is taken meanwhile, so the rate
// and ETA of its last steps say nothing of it: `sched status` says the
// phase in their place.
const (
	PhaseUpload  = "upload"
	PhaseResults = "results"
)

// ReadRunStates returns every run that has recorded progress, by name.
func ReadRunStates(ctx context.Context, rdb redis.UniversalClient) ([]RunState, error) {
	var out []RunState
	iter := rdb.Scan(ctx, 0, "kiln:run:*:state", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		run := strings.TrimSuffix(strings.TrimPrefix(key, "kiln:run:"), ":state")
		h, err := rdb.HGetAll(ctx, key).Result()
		if err != nil {
			return nil, fmt.Errorf("read state of run %s: %w", run, err)
		}
		out = append(out, parseRunState(run, h))
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("list runs: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Run < out[j].Run })
	return out, nil
}

// ReadRunState returns run's recorded progress; ok is false when the run
// has recorded none.
func ReadRunState(ctx context.Context, rdb redis.UniversalClient, run string) (s RunState, ok bool, err error) {
	h, err := rdb.HGetAll(ctx, RunStateKey(run)).Result()
	if err != nil {
		return RunState{}, false, fmt.Errorf("read state of run %s: %w", run, err)
	}
	return parseRunState(run, h), len(h) > 0, nil
}

func parseRunState(run string, h map[string]string) RunState {
	s := RunState{Run: run, Checkpoint: -1, Worker: h["worker"], Done: h["done"] == "true"}
	s.Step, _ = strconv.Atoi(h["step"])
	s.Total, _ = strconv.Atoi(h["total"])
	s.Tokens, _ = strconv.ParseInt(h["tokens"], 10, 64)
	s.Loss, _ = strconv.ParseFloat(h["loss"], 64)
	s.LossStep = lossStep(h)
	s.TokPerS, _ = strconv.ParseFloat(h["tok_per_s"], 64)
	s.GPUs, _ = strconv.Atoi(h["gpus"])
	s.Seq, _ = strconv.Atoi(h["seq"])
	s.Shape = h["shape"]
	s.Phase = h["phase"]
	if v, err := strconv.ParseUint(h["seed"], 10, 64); err == nil {
		s.Seed, s.HasSeed = v, true
	}
	s.EvalLoss, _ = strconv.ParseFloat(h["eval_loss"], 64)
	s.UploadSeconds, _ = strconv.ParseFloat(h["checkpoint_upload_s"], 64)
	if v, err := strconv.ParseFloat(h["eta_s"], 64); err == nil {
		s.ETA = time.Duration(v) * time.Second
	}
	if v, err := strconv.ParseFloat(h["wall_s"], 64); err == nil {
		s.Wall = time.Duration(v * float64(time.Second))
	}
	if v, err := strconv.Atoi(h["checkpoint"]); err == nil {
		s.Checkpoint = v
	}
	s.CheckpointAt, _ = time.Parse(time.RFC3339, h["checkpoint_at"])
	s.Updated, _ = time.Parse(time.RFC3339, h["updated"])
	s.Unsent = parseUnsent(h)
	return s
}

// Finishing says what the run's last segment does now that its training
// is over, its phase in words: "uploading its last checkpoint (step 40)";
// "" while it trains, once the run is done, and for a phase this kiln does
// not know (one a later kiln records), which reads as before.
func (s RunState) Finishing() string {
	if s.Done {
		return ""
	}
	switch {
	case s.Phase == PhaseUpload && s.Checkpoint < s.Step:
		return fmt.Sprintf("uploading its last checkpoint (step %d)", s.Step)
	case (s.Phase == PhaseUpload || s.Phase == PhaseResults) && s.Checkpoint >= s.Step:
		// The upload phase goes on once the checkpoint is recorded: the
		// retention and results after it are its last part.
		return fmt.Sprintf("its last checkpoint (step %d) is uploaded; writing its results", s.Step)
	case s.Phase == PhaseResults:
		return "writing its results"
	}
	return ""
}

// Quiet is how long a running task, or a run whose segment trains, may go
// without a report before it reads as quiet: `sched status` says when it
// last reported in place of its rate and ETA, and the run's tok/s metric
// reads 0. A segment reports at every logged step; one that has not for
// this long is stopped, or hangs (a GPU's wait ends its process only after
// KILN_CUDA_HANG_TIMEOUT, 10 minutes by default), or logs too rarely for
// its step time.
const Quiet = 5 * time.Minute

// LastReport is when the run last reported: its state's last write (at a
// logged step), or where its segment task runs (running, nil where none
// does), that task's last progress, which the worker writes as the task
// starts, whichever is later. A segment that has just begun after the run
// waited for the GPU has logged no step yet and is not quiet. Zero where
// neither says.
func (s RunState) LastReport(running *TaskStatus) time.Time {
	last := s.Updated
	if running != nil && running.HasProgress && running.Progress.Updated.After(last) {
		last = running.Progress.Updated
	}
	return last
}

// Silent reports, with LastReport, whether the run's segment runs
// (running), trains (its training is not over: a last segment waiting for
// its uploads writes nothing either, for the minutes a slow store takes)
// and has not reported for Quiet at now: a hung step (a stopped process, a
// GPU that hangs) writes nothing, and the rate and ETA of its last logged
// interval would stand for as long.
func (s RunState) Silent(running *TaskStatus, now time.Time) (last time.Time, silent bool) {
	last = s.LastReport(running)
	return last, running != nil && s.Finishing() == "" && !last.IsZero() && now.Sub(last) >= Quiet
}

// OnGPUs is " on N GPUs" where the run's rate is that of several, or "".
func (s RunState) OnGPUs() string {
	if s.GPUs > 1 {
		return fmt.Sprintf(" on %d GPUs", s.GPUs)
	}
	return ""
}

// String is the run's one-line status: step/total, loss (with its step
// where that is another), tok/s, ETA and last checkpoint, and where the
// newer checkpoints are while object storage does not take them; once its
// training is over, what its last segment does in place of the rate and
// ETA.
func (s RunState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: step %d/%d", s.Run, s.Step, s.Total)
	if s.Loss > 0 {
		fmt.Fprintf(&b, ", loss %.4f", s.Loss)
		if s.LossAt() != s.Step {
			fmt.Fprintf(&b, " at step %d", s.LossAt())
		}
	}
	finishing := s.Finishing()
	if s.TokPerS > 0 && finishing == "" {
		fmt.Fprintf(&b, ", %.0f tok/s%s", s.TokPerS, s.OnGPUs())
	}
	switch {
	case s.Done:
		b.WriteString(", done")
	case finishing != "":
		b.WriteString(", training is over: " + finishing)
	case s.ETA > 0:
		fmt.Fprintf(&b, ", ETA %s", s.ETA.Round(time.Minute))
	}
	if s.Checkpoint >= 0 {
		fmt.Fprintf(&b, ", last checkpoint step %d", s.Checkpoint)
		if !s.CheckpointAt.IsZero() {
			fmt.Fprintf(&b, " at %s", s.CheckpointAt.Format(time.RFC3339))
		}
	} else {
		b.WriteString(", no checkpoint yet")
	}
	if s.Worker != "" && !s.Done {
		fmt.Fprintf(&b, " (worker %s)", s.Worker)
	}
	if note := s.UnsentNote(); note != "" {
		b.WriteString("; " + note)
	}
	return b.String()
}
