package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/spf13/cobra"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// newEnqueueTrainCmd is `sched enqueue train`, added to the enqueue
// command by enqueue.go.
func newEnqueueTrainCmd() *cobra.Command {
	var engine string
	cmd := &cobra.Command{
		Use:   "train <run>",
		Short: "Queue a run's training (train:segment) for the GPU worker, or resume a stopped one",
		Long: `Queues the first training segment of a run; each segment queues the next until the
run is done. A run is a name in the run presets ('sched runs --presets' lists them:
pilot, pilot-cpu, long, demo) or in your own YAML file named by KILN_RUNS, on this machine
and on the GPU worker; the run says the model, the data mixture, the tokenizer and
the schedule.

Before anything is queued the run is checked: its settings (and, for a run that
has checkpointed, that they can resume it), its tokenizer (made, or being made by
'sched enqueue tokenizer'), the tokenizer's vocabulary against the model's, and
each token store of its mixture (filled, or being filled by 'sched enqueue
ingest', by the run's tokenizer, one of them at least with a held-out window for
evaluation). A store too small for a held-out window is named in a note: the
run's eval loss, and the gates judged on it, leave it out. A run whose tokenizer
or stores are still being made waits for them on the worker.

Enqueuing a run that was cancelled, stopped or failed resumes it from its last
checkpoint (a segment cancelled a moment ago that still stops is waited for, and
the run resumes from the checkpoint its stop writes); a run already queued or
training is left alone, and so is a run done
at its total steps (give it a longer total_steps or total_tokens in a runs file
to train it further).`,
		Args: exactArgs(1, "one run name"),
		Example: `  sched enqueue train pilot
  KILN_RUNS=runs.yaml sched enqueue train my-run
  sched enqueue train pilot-cpu --engine cpu`,
	}
	cmd.Flags().StringVar(&engine, "engine", "", "engine: cuda, cpu or auto (default: the run's)")
	noEmpty(cmd.Flags(), "engine", "cuda, cpu or auto", "the run's engine")
	cmd.RunE = func(c *cobra.Command, args []string) error {
		cfg, err := loadConfig(c)
		if err != nil {
			return err
		}
		if err := checkName("run", args[0]); err != nil {
			return err
		}
		switch engine {
		case "", "auto", "cuda", "cpu":
		default:
			return badInput("--engine %q: use cuda, cpu or auto", engine)
		}
		set, err := loadRuns()
		if err != nil {
			return err
		}
		run, err := getRun(set, args[0])
		if err != nil {
			return err
		}
		// A run names the tokenizer its stores were made with, and that
		// wins over the configured default; only an explicit --tokenizer
		// overrides it (and the worker then checks the stores against it).
		ts := scheduler.TrainSegment{Run: args[0], Engine: engine}
		tok := run.Tokenizer
		if c.Flags().Changed("tokenizer") || tok == "" {
			ts.Tokenizer, tok = cfg.Tokenizer, cfg.Tokenizer
		}
		ctx := c.Context()
		if ctx == nil {
			ctx = context.Background()
		}
		objects, err := openStore(ctx, cfg)
		if err != nil {
			return err
		}
		q, _, err := openQueue(ctx, cfg)
		if err != nil {
			return err
		}
		defer q.Close()
		// A segment cancelled a moment ago may still be stopping: the run
		// resumes from the checkpoint its stop writes, once it has.
		if snap, err := q.SnapshotOf(ctx, scheduler.QueueGPU); err != nil {
			return err
		} else if rt, ok := snap.RunTasks()[args[0]]; ok && rt.Task.State == "archived" && rt.Task.Cancelled {
			if err := waitCancelStop(c, q, rt.Task.ID, "queuing the run again from the checkpoint of the step it stops at"); err != nil {
				return err
			}
		}
		pos, notes, err := checkRun(ctx, trainCheck{cfg: cfg, q: q, objects: objects}, run, tok)
		if err != nil {
			return err
		}
		// A run that has checkpointed resumes from its newest checkpoint
		// (the worker finds it); the segment says so, which also gives it
		// its own task id rather than the first segment's, long finished.
		st, ok, fromStorage := pos.st, pos.ok, pos.fromStorage
		ts.FromStep = pos.from
		// A run at its total steps would queue a segment that ends at
		// once. The total is the runs entry's as read here, so that a run
		// given a longer one resumes.
		at, total := trainedTo(st, ok, ts.FromStep), run.RunConfig.WithDefaults().TotalSteps
		if at >= total && (!ok || st.Done) {
			return sayDoneDropping(c, q, ts.Run, at, total)
		}
		// The length the segment is queued for: status gives it while the
		// segment waits, and a worker whose runs entry ends the run
		// sooner says so rather than ending it there.
		ts.TotalSteps = int64(total)
		where := ""
		if fromStorage {
			// A segment stopped as Redis lost its data checkpoints on its
			// disk, and does not mark that one complete in object
			// storage: the worker resumes from the newer.
			where = "the newest in object storage, or a newer one where the GPU worker's disk holds one: Redis holds no record of the run, and a segment stopped as Redis lost its data checkpoints there"
		}
		if err := enqueueFrom(c, cfg, ts, where); err != nil {
			return err
		}
		if at < total {
			printNotes(c.OutOrStdout(), notes)
			return nil
		}
		// A run stopped short of its total (cancelled, or failed) whose
		// runs entry now ends it at or before its checkpoint: the segment
		// ends it there, and judges its results, as its last.
		fmt.Fprintf(c.OutOrStdout(), "its total_steps %d is at or before that checkpoint: the segment trains no step, and ends the run there, judging its results\n", total)
		return nil
	}
	return cmd
}

// checkStepSize refuses a run whose length is total_tokens and whose
// runs entry now gives another number of tokens a step (seq x batch x
// accumulate) than it trained with so far, as its state says: its
// total_steps counts the whole run in steps of the new size, so a larger
// step would read as done here (and end the run early), a smaller one
// train past its tokens. The worker refuses such a segment too.
func checkStepSize(run runs.Run, st scheduler.RunState, ok bool) error {
	rc := run.RunConfig.WithDefaults()
	if !ok || st.Step <= 0 || st.Tokens <= 0 || !rc.LengthInTokens() ||
		st.Tokens%int64(st.Step) != 0 {
		return nil
	}
	was, now := st.Tokens/int64(st.Step), int64(rc.TokensPerStep())
	if was == now {
		return nil
	}
	return badInput("run %s trained %d tokens a step (%d tokens by step %d), and its runs entry now gives %d (seq %d x batch %d x accumulate %d); "+
		"its length is total_tokens %d, which in steps of the new size ends at step %d: keep seq x batch x accumulate at %d "+
		"(a smaller batch with accumulate raised as much), or give the run's length as total_steps",
		run.Name, was, st.Tokens, st.Step, now, rc.Seq, rc.Batch, rc.Accumulate, rc.TotalTokens, rc.TotalSteps, was)
}

// fitsLargestCard refuses a run whose step no card kiln supports could
// hold: where it is asked (enqueue, sched config) the GPU worker's device
// is unknown, and the worker sizes the run against its own.
func fitsLargestCard(rc trainer.RunConfig, mc model.Config) error {
	engine := rc.Engine
	if engine == "auto" {
		engine = "cuda"
	}
	plan := model.MemoryPlan{Config: mc, Engine: engine, Precision: rc.Precision, Batch: rc.Batch, Seq: rc.Seq, Purpose: model.PurposeTrain}
	return model.CheckMemory(plan, model.LargestGPU, "the largest card kiln supports (an H200, 141 GB)")
}

// checkShape refuses a resume that the worker would refuse: the runs entry
// now gives another model layout, sequence length or seed than the run's
// checkpoints hold (as its state records them), which the checkpoint's
// weights or the data cursor cannot be read with. A run with no checkpoint
// yet (from 0) starts afresh, in any shape.
func checkShape(run runs.Run, st scheduler.RunState, ok bool, from int64) error {
	if !ok || from <= 0 {
		return nil
	}
	rc := run.RunConfig.WithDefaults()
	const what = "put its entry back as it was in the runs file (KILN_RUNS), or train a run of another name (`from: %s` starts one from its settings)"
	if st.Seq > 0 && st.Seq != rc.Seq {
		return badInput("run %s trained at seq %d and its runs entry now gives seq %d, which its checkpoints' data order cannot resume: "+what, run.Name, st.Seq, rc.Seq, run.Name)
	}
	if st.HasSeed && st.Seed != rc.Seed {
		return badInput("run %s trained with seed %d and its runs entry now gives seed %d, which its checkpoints' data order cannot resume: "+what, run.Name, st.Seed, rc.Seed, run.Name)
	}
	mc, err := rc.ModelConfig()
	if err != nil {
		return err
	}
	if now := trainer.Shape(mc); st.Shape != "" && st.Shape != now {
		return badInput("run %s's checkpoints hold a model of another layout than its runs entry now gives, %s: "+what, run.Name, trainer.ShapeDiff(st.Shape, now), run.Name)
	}
	return nil
}

// sayDoneDropping says that run is done at step at of total (sayDone),
// first dropping its archived segments that were to train it past at: an
// extension past its end that failed or was refused (a runs entry changed
// as no resume may, since put back) is what status would say became of
// the run, for the archive's 30 days.
func sayDoneDropping(c *cobra.Command, q *scheduler.Client, run string, at, total int) error {
	ctx := c.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	dropped, err := q.DropArchivedSegmentsFrom(ctx, run, int64(at))
	if len(dropped) > 0 {
		fmt.Fprintf(c.OutOrStdout(), "the segment that was to train run %s past step %d, and failed or was cancelled, is dropped: %s\n", run, at, strings.Join(dropped, ", "))
	}
	if err != nil {
		return err
	}
	sayDone(c.OutOrStdout(), run, at, total)
	return nil
}

// sayDone says that run is done at step at of total, so that nothing was
// queued, and how to train it further.
func sayDone(w io.Writer, run string, at, total int) {
	// A run whose total was lowered below the step it reached is done
	// there: "done at step 1000 of 500" read as a fault.
	where := fmt.Sprintf("at step %d of %d", at, total)
	if at > total {
		where = fmt.Sprintf("at step %d, past its total of %d", at, total)
	}
	fmt.Fprintf(w, "run %s is done %s; nothing queued (to train it further, give it a longer total_steps or total_tokens in a runs file, named by KILN_RUNS here and on the GPU worker, and enqueue it again; or train a run of another name)\n",
		run, where)
}

// trainedTo is the step a run has surely trained to: the checkpoint its
// next segment resumes from, or the step of a run whose state says it is
// done (a segment records that only once its last checkpoint is in object
// storage, which the state's checkpoint may not say yet).
func trainedTo(st scheduler.RunState, ok bool, from int64) int {
	if ok && st.Done {
		return max(int(from), st.Step)
	}
	return int(from)
}

// trainCheck is what checkRun reads: the queue (work under way), the
// object store (tokenizers, store status) and the local data directory.
type trainCheck struct {
	cfg     scheduler.Config
	q       *scheduler.Client
	objects store.Store
}

// runAt is where a run stands: its state in Redis (ok: Redis holds one),
// and from, the checkpoint its next segment resumes from (0: none), which
// object storage gives where Redis holds no record (fromStorage).
type runAt struct {
	st          scheduler.RunState
	ok          bool
	from        int64
	fromStorage bool
}

// readRunAt reads where run stands.
func readRunAt(ctx context.Context, tc trainCheck, run string) (runAt, error) {
	st, ok, err := scheduler.ReadRunState(ctx, tc.q.Redis(), run)
	if err != nil {
		return runAt{}, err
	}
	at := runAt{st: st, ok: ok}
	if ok && st.Checkpoint > 0 {
		at.from = int64(st.Checkpoint)
		return at, nil
	}
	// Redis lost the run's state (its data lost, or another Redis):
	// object storage still says where the run is.
	steps, err := segment.RemoteSteps(ctx, tc.objects, run)
	if err != nil {
		return runAt{}, err
	}
	if len(steps) > 0 {
		at.from, at.fromStorage = int64(steps[len(steps)-1]), true
	}
	return at, nil
}

// checkRun refuses, as bad input naming what to do, a run that could
// never train, or not go on from where it stands (readRunAt): invalid
// settings, a model layout, sequence length or seed its checkpoints
// cannot resume with, another number of tokens a step for a length in
// tokens, a warmup a new run cannot take, a tokenizer that neither exists
// nor is being made, a vocabulary larger than the model's, another
// tokenizer or other stores than its newest checkpoint was trained with
// (checkResume), a store that
// is neither filled nor being filled, one made by another tokenizer than
// the run's, or stores none of which holds a held-out window to evaluate
// on. The resume's refusals come before those of the data: a sequence
// length changed mid-run leaves the stores fewer windows of the new
// length, often none held out, and the change, which no ingest mends, is
// what to fix. It returns where the run stands, and notes to print once
// its segment is queued: each store that evaluation leaves out, holding
// too few tokens for a held-out window.
func checkRun(ctx context.Context, tc trainCheck, run runs.Run, tok string) (runAt, []string, error) {
	rc := run.RunConfig.WithDefaults()
	if err := rc.Validate(); err != nil {
		return runAt{}, nil, invalidRun(fmt.Errorf("run %s: %w", run.Name, err))
	}
	mc, err := rc.ModelConfig()
	if err != nil {
		return runAt{}, nil, invalidRun(fmt.Errorf("run %s: %w", run.Name, err))
	}
	at, err := readRunAt(ctx, tc, run.Name)
	if err != nil {
		return runAt{}, nil, err
	}
	// The shape first: a step size kept, as the other check asks, does
	// not make another sequence length resumable.
	if err := checkShape(run, at.st, at.ok, at.from); err != nil {
		return runAt{}, nil, err
	}
	if err := checkStepSize(run, at.st, at.ok); err != nil {
		return runAt{}, nil, err
	}
	// A new run only: one under way resumes as it began.
	if trainedTo(at.st, at.ok, at.from) == 0 {
		if err := rc.CheckWarmup(); err != nil {
			return runAt{}, nil, badInput("run %s: %v: edit its runs entry", run.Name, err)
		}
	}
	if err := fitsLargestCard(rc, mc); err != nil {
		if at.from > 0 {
			err = &trainer.ResumedError{Step: int(at.from), Err: err}
		}
		return runAt{}, nil, badInput("run %s: %v", run.Name, runs.SizeAdvice(run.Name, err))
	}
	uses, putBack, err := checkRunTokenizer(ctx, tc, run.Name, tok, rc.Model, mc)
	if err != nil {
		return runAt{}, nil, err
	}
	if err := checkResume(ctx, tc, run.Name, at.from, rc, uses); err != nil {
		return runAt{}, nil, err
	}
	// Evaluation needs one held-out window in any of the stores. Which
	// windows are held out depends on their index alone: a store has one
	// once it holds the first of them.
	first, need := tokens.FirstHeldOut(0), tokens.HeldOutNeed(0, rc.Seq)
	var most int64
	filling := false
	var short []string
	for _, m := range rc.Mixture {
		held, live, err := checkRunStore(ctx, tc, run.Name, m.Store, uses, tok)
		if err != nil {
			return runAt{}, nil, err
		}
		most, filling = max(most, held), filling || live
		// A store being filled is judged by the worker, once it is.
		if !live && held < need {
			short = append(short, fmt.Sprintf("note: token store %s holds %d tokens, too few for a held-out window of run %s (at seq %d a store needs %d): "+
				"the run's eval loss, and the gates judged on it, leave that store out until it holds them; ingest more into it (an ingest with a higher --max-tokens appends only what it left out)",
				m.Store, held, run.Name, rc.Seq, need))
		}
	}
	var notes []string
	if putBack != "" {
		notes = append(notes, putBack)
	}
	if rc.EvalEvery <= 0 || rc.EvalBatches <= 0 {
		return at, notes, nil
	}
	if !filling && most < need {
		return runAt{}, nil, badInput("run %s: its token stores hold at most %d tokens, too few for one evaluation window (about 1 window of %d tokens in %d is held out, the first of them at window %d, so a store needs %d tokens): ingest more, or set eval_every: 0 in the run",
			run.Name, most, rc.Seq+1, tokens.DefaultHoldOut, first, need)
	}
	return at, append(notes, short...), nil
}

// checkResume refuses a resume from step from that the worker would
// refuse once it has read that checkpoint, with its own check
// (trainer.CheckResume) and words: another tokenizer than the run trained
// with (uses, told apart by its SHA-256; nil while it is being made, and
// then left to the worker), other stores in its mixture, another seed or sequence length, another
// number of tokens a step for a length in tokens. The checkpoint's
// trainer_state.json is read from object storage, where from names the
// newest; one not there, or not as its marker lists it (damaged), is left
// to the worker, which passes over a damaged checkpoint to an earlier one.
func checkResume(ctx context.Context, tc trainCheck, run string, from int64, rc trainer.RunConfig, uses *catalog.Entry) error {
	if from <= 0 {
		return nil
	}
	dir := segment.CheckpointPrefix(run) + trainer.StepDir(int(from))
	st, ok, err := segment.StoredState(ctx, tc.objects, run, int(from))
	if err != nil || !ok {
		return err
	}
	var tok tokens.Tokenizer
	if uses != nil {
		tok = tokens.Tokenizer{Name: uses.Name, SHA256: uses.SHA256}
	}
	if err := trainer.CheckResume(dir, st, rc, tok); err != nil {
		return fmt.Errorf("run %s: %w", run, err)
	}
	return nil
}

// printNotes writes notes, one a line.
func printNotes(w io.Writer, notes []string) {
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}

// checkRunTokenizer refuses a run's tokenizer that neither exists nor is
// being made, or that has more ids than the model; it returns the
// tokenizer, or nil while it is being made. A run with checkpoints whose
// tokenizer is gone has it put back from the copy they hold
// (segment.PutBackTokenizer), as its segment would, and the note to print
// says so.
func checkRunTokenizer(ctx context.Context, tc trainCheck, run, name, modelName string, mc model.Config) (*catalog.Entry, string, error) {
	if name == "" {
		return nil, "", badInput("run %s names no tokenizer: set tokenizer: in its runs entry, or pass --tokenizer NAME", run)
	}
	entry, _, err := catalog.New(tc.objects, tc.cfg.DataDir).Resolve(ctx, name)
	var nf *catalog.NotFoundError
	note := ""
	switch {
	case errors.As(err, &nf):
		live, lerr := tc.q.LiveTokenizer(ctx, name)
		if lerr != nil {
			return nil, "", lerr
		}
		if live != nil {
			// Its ids are not known yet, but the number it was asked
			// for is: more than the model holds, and the segment would
			// fail once the tokenizer is made.
			if asked := liveTokenizerVocab(live); asked > mc.VocabSize {
				return nil, "", badInput("run %s: tokenizer %s, being made (task %s), was asked for %d ids but the %s model's vocab_size is %d: the run could never use it; give the run a tokenizer of at most %d ids ('sched enqueue tokenizer <another name> --vocab %d'), or a model with a larger vocab_size",
					run, name, live.ID, asked, modelName, mc.VocabSize, mc.VocabSize, mc.VocabSize)
			}
			return nil, "", nil // the worker waits for it
		}
		var said string
		entry, said, err = segment.RestoreTokenizer(ctx, tc.objects, tc.cfg.DataDir, run, "", nf)
		switch {
		case errors.Is(err, nf):
			// A tokenizer not made yet: the request as the run needs it.
			request := tokenizerFor(name, mc.VocabSize)
			return nil, "", badInput("run %s trains with tokenizer %s, which does not exist yet: make it first with '%s' (the %s model's vocab_size; 'sched tokenizers' lists the existing ones)", run, name, request, modelName)
		case err != nil:
			return nil, "", err
		}
		note = "note: " + said
	case err != nil:
		return nil, "", err
	}
	if entry.VocabSize > mc.VocabSize {
		return nil, "", badInput("run %s: tokenizer %s has %d ids but the %s model's vocab_size is %d: use a tokenizer of at most %d ids, or a model with a larger vocab_size",
			run, name, entry.VocabSize, modelName, mc.VocabSize, mc.VocabSize)
	}
	return &entry, note, nil
}

// liveTokenizerVocab is the vocabulary a live tokenizer task was asked
// for (0: not said).
func liveTokenizerVocab(ti *asynq.TaskInfo) int {
	if ti.Type == scheduler.KindTokenizerTrain {
		a, _ := scheduler.Decode[scheduler.TokenizerTrain](ti.Payload)
		return a.VocabSize
	}
	a, _ := scheduler.Decode[scheduler.TokenizerSample](ti.Payload)
	return a.VocabSize
}

// checkRunStore refuses a store of the run that another tokenizer than
// uses (nil: tok, being made) made, and one that holds nothing and that
// no ingest is filling; it returns the tokens the store holds, and whether
// an ingest is filling it.
func checkRunStore(ctx context.Context, tc trainCheck, run, name string, uses *catalog.Entry, tok string) (held int64, filling bool, err error) {
	if filepath.IsAbs(name) {
		m, err := tokens.ReadManifest(name)
		if err != nil {
			return 0, false, badInput("run %s trains on the token store at %s: %v", run, name, err)
		}
		held = m.Tokens
		if err := checkStoreTokenizer(run, name, m.Tokenizer, uses, tok); err != nil {
			return 0, false, err
		}
	} else {
		st, err := storeStatus(ctx, tc.objects, tc.q.Redis(), name)
		if err != nil {
			return 0, false, err
		}
		if st.Damaged != "" {
			return 0, false, badInput("run %s trains on token store %s, which is damaged: %s", run, name, st.Damaged)
		}
		held = st.Tokens
		made := st.Tokenizer
		// A store filled in this process's data directory without the
		// queue (sched ingest --direct) publishes no status.
		if m, err := tokens.ReadManifest(filepath.Join(tc.cfg.DataDir, "tokens", name)); err == nil {
			if m.Tokens > held {
				held = m.Tokens
			}
			if made.SHA256 == "" {
				made = m.Tokenizer
			}
		}
		// Also while an ingest fills the store: an append with another
		// tokenizer than the one that wrote it is refused, so it keeps it.
		if err := checkStoreTokenizer(run, name, made, uses, tok); err != nil {
			return 0, false, err
		}
		live, err := tc.q.LiveIngest(ctx, name)
		if err != nil {
			return 0, false, err
		}
		if live > 0 {
			return held, true, nil // the worker waits for the ingest
		}
	}
	if held == 0 {
		first := "sched enqueue ingest " + name
		if demo := demoIngest(name, tok); demo != "" {
			first = demo
		} else if presets, err := ingest.Presets(""); err != nil || presets[name].Name == "" {
			first = "sched enqueue ingest <dataset> --store " + name
		}
		// A named store is known here by its status, which the appending
		// worker writes, also at its start for each store on its disk
		// (ingest.Pipeline.ReconcileStatuses): a store copied there, a
		// backup put back, has none until that worker starts again.
		copied := ""
		if !filepath.IsAbs(name) {
			copied = "; if its files were copied onto the worker's disk, restarting the worker that serves the append queue records them"
		}
		return 0, false, badInput("run %s trains on token store %s, which holds no tokens and which no ingest is filling: run '%s' first ('sched status' shows an ingest that failed)%s", run, name, first, copied)
	}
	return held, false, nil
}

// checkStoreTokenizer refuses store name, whose ids tokenizer made wrote,
// to a run that trains with uses: the ids would mean other text than the
// run's checkpoints say, and the worker would refuse the segment. The
// comparison is the worker's (catalog.CheckUses). Where the run's
// tokenizer, tok, is still being made (uses nil), its ids are not known
// but its name is, and a published name never names another tokenizer:
// a store that records another name was made by another tokenizer. A
// store that records no tokenizer (a status from before the field, or no
// ids yet), or no name (a tokenizer file's), is left to the worker then.
func checkStoreTokenizer(run, name string, made tokens.Tokenizer, uses *catalog.Entry, tok string) error {
	if made.SHA256 == "" {
		return nil
	}
	want := tokens.Tokenizer{Name: tok}
	switch {
	case uses == nil && (made.Name == "" || made.Name == tok):
		return nil
	case uses != nil:
		var me *catalog.MismatchError
		if err := catalog.CheckUses(catalog.Store{Store: name, Tokenizer: made}, *uses); !errors.As(err, &me) {
			return err
		}
		want = me.TokB
	}
	return storeMadeByAnother(run, name, made, want)
}

// storeMadeByAnother is the refusal of a run that trains with tokenizer
// want (with no SHA-256: one being made) on store name, which tokenizer
// made wrote.
func storeMadeByAnother(run, name string, made, want tokens.Tokenizer) error {
	mine := tokenizerLabel(want)
	if want.SHA256 == "" {
		mine = "tokenizer " + want.Name + " (being made)"
	}
	dataset, other := "<dataset>", "<another store>"
	if !filepath.IsAbs(name) {
		if presets, err := ingest.Presets(""); err == nil && presets[name].Name != "" {
			dataset = name
		}
		if n := name + "-" + want.Name; ingest.CheckStoreName(n) == nil {
			other = n
		}
	}
	theirs := "the tokenizer that made the store ('sched tokenizers' lists each with its sha256)"
	if made.Name != "" {
		theirs = fmt.Sprintf("tokenizer %s (tokenizer: %s in its runs entry, or --tokenizer %s)", made.Name, made.Name, made.Name)
	}
	return badInput("run %s trains with %s but its token store %s was made by %s: their ids mean different text; ingest the store's data with %s into another store ('sched enqueue ingest %s --store %s --tokenizer %s', then name that store in the run's mixture), or give the run %s",
		run, mine, name, tokenizerLabel(made), want.Name, dataset, other, want.Name, theirs)
}

// tokenizerLabel names t with the first 12 digits of its SHA-256, as
// 'sched tokenizers' lists it.
func tokenizerLabel(t tokens.Tokenizer) string {
	if t.Name == "" {
		return fmt.Sprintf("an unnamed tokenizer (sha256 %.12s)", t.SHA256)
	}
	return fmt.Sprintf("tokenizer %s (sha256 %.12s)", t.Name, t.SHA256)
}
