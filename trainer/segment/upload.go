package segment

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// uploader pushes checkpoints to object storage on its own goroutine, so
// that training continues while a checkpoint of hundreds of megabytes goes
// up. One checkpoint may wait while another uploads; a third blocks the
// trainer, which bounds the local disk a slow store can cost.
type uploader struct {
	p    Params
	lock Lease
	dir  string
	rc   trainer.RunConfig
	log  *zap.Logger
	wall func() time.Duration
	// from and began are the segment's first step and start, for its
	// event file.
	from  int
	began time.Time

	jobs   chan upJob
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	uploaded int
	lastErr  error
}

type upJob struct {
	dir  string
	step int
}

func newUploader(p Params, lock Lease, dir string, rc trainer.RunConfig, log *zap.Logger, wall func() time.Duration) *uploader {
	// Uploads outlive the segment's context: a cancelled segment still owes
	// object storage its last checkpoint, within UploadGrace.
	ctx, cancel := context.WithCancel(context.Background())
	return &uploader{p: p, lock: lock, dir: dir, rc: rc, log: log, wall: wall, jobs: make(chan upJob, 1),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), uploaded: -1}
}

func (u *uploader) push(dir string, step int) { u.jobs <- upJob{dir, step} }

func (u *uploader) uploadedStep() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.uploaded
}

func (u *uploader) loop() {
	defer close(u.done)
	for j := range u.jobs {
		err := u.upload(j)
		u.mu.Lock()
		u.lastErr = err
		if err == nil {
			u.uploaded = j.step
		}
		u.mu.Unlock()
		if err != nil {
			u.log.Error("checkpoint upload failed; the next checkpoint retries", zap.Int("step", j.step), zap.Error(err))
		}
	}
}

func (u *uploader) upload(j upJob) error {
	if u.p.Objects == nil {
		u.pruneLocal(j.step)
		return nil
	}
	start := time.Now()
	m, err := Push(u.ctx, u.p.Objects, u.lock, u.p.Run.Name, j.dir)
	if err != nil {
		return err
	}
	var bytes int64
	for _, n := range m.Files {
		bytes += n
	}
	u.log.Info("checkpoint uploaded", zap.Int("step", j.step), zap.Int64("bytes", bytes), zap.Duration("took", time.Since(start)))
	if err := u.lock.Fenced(u.ctx, map[string]string{
		"checkpoint": strconv.Itoa(j.step), "checkpoint_at": time.Now().UTC().Format(time.RFC3339),
		"checkpoint_upload_s": strconv.FormatFloat(time.Since(start).Seconds(), 'f', 3, 64),
	}); err != nil {
		return err
	}
	ret := u.p.Run.Retention
	if deleted, err := Prune(u.ctx, u.p.Objects, u.p.Run.Name, u.rc.CheckpointEvery, ret.KeepLast, ret.KeepEvery); err != nil {
		u.log.Warn("checkpoint retention", zap.Error(err))
	} else if len(deleted) > 0 {
		u.log.Info("checkpoints deleted by retention", zap.Ints("steps", deleted))
	}
	u.pruneLocal(j.step)
	if err := u.p.writeResults(u.ctx, u.dir, u.rc, Outcome{Step: j.step, TotalSteps: u.rc.TotalSteps, Wall: u.wall(),
		ResumedFrom: u.from, Began: u.began}, u.log); err != nil {
		u.log.Warn("results", zap.Error(err))
	}
	return nil
}

// pruneLocal keeps the newest two local checkpoints: the one just written
// and the one before it, which a resume falls back to if the newest turns
// out unreadable. Older ones are already in object storage. Without object
// storage, the local disk is the only copy, and retention applies to it.
func (u *uploader) pruneLocal(newest int) {
	steps := localSteps(u.dir)
	keep := map[int]bool{}
	if u.p.Objects == nil {
		keep = Keep(steps, u.rc.CheckpointEvery, u.p.Run.Retention.KeepLast, u.p.Run.Retention.KeepEvery)
	}
	for i, s := range steps {
		if s > newest || i >= len(steps)-2 || keep[s] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(u.dir, trainer.StepDir(s))); err != nil {
			u.log.Warn("remove local checkpoint", zap.Int("step", s), zap.Error(err))
		}
	}
}

// finish waits for the queued uploads. After a cancellation it waits at
// most grace, then abandons the upload in flight (its marker is never
// written, so object storage stays consistent). It returns the error of the
// last checkpoint's upload, if that one failed.
func (u *uploader) finish(ctx context.Context, grace time.Duration) error {
	close(u.jobs)
	if ctx.Err() == nil {
		<-u.done
	} else {
		t := time.NewTimer(grace)
		select {
		case <-u.done:
			t.Stop()
		case <-t.C:
			u.log.Warn("upload grace over; the run resumes from the last uploaded checkpoint", zap.Duration("grace", grace))
			u.cancel()
			<-u.done
		}
	}
	u.cancel()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.lastErr != nil {
		return fmt.Errorf("upload of the last checkpoint: %w", u.lastErr)
	}
	return nil
}

func localSteps(dir string) []int {
	entries, _ := os.ReadDir(dir)
	var steps []int
	for _, e := range entries {
		if s, ok := trainer.DirStep(e.Name()); ok && e.IsDir() {
			steps = append(steps, s)
		}
	}
	sort.Ints(steps)
	return steps
}

// ErrDiskFull is the disk guard's error: the local disk has less free space
// than the run's min_free_disk even after removing what object storage
// already holds.
var ErrDiskFull = errors.New("local disk below min_free_disk")

// guardDisk keeps dir's filesystem above the run's min_free_disk: below it,
// local checkpoints already uploaded (up to step uploaded) go first, never
// the newest; if that is not enough the segment stops with ErrDiskFull
// rather than fill the disk the token stores live on.
func (p Params) guardDisk(dir string, uploaded int) error {
	min := int64(p.Run.MinFreeDisk)
	if min <= 0 {
		return nil
	}
	free, err := p.FreeSpace(dir)
	if err != nil {
		return fmt.Errorf("disk guard: %w", err)
	}
	if free >= min {
		return nil
	}
	steps := localSteps(dir)
	for i, s := range steps {
		if i == len(steps)-1 || s > uploaded {
			break
		}
		if err := os.RemoveAll(filepath.Join(dir, trainer.StepDir(s))); err != nil {
			return fmt.Errorf("disk guard: %w", err)
		}
		p.Log.Warn("disk guard removed an uploaded local checkpoint", zap.String("run", p.Run.Name), zap.Int("step", s))
		if free, err = p.FreeSpace(dir); err != nil {
			return fmt.Errorf("disk guard: %w", err)
		}
		if free >= min {
			return nil
		}
	}
	return fmt.Errorf("%w: run %s: %s has %s free, below min_free_disk %s: free space on that disk, or lower min_free_disk in a runs file", ErrDiskFull, p.Run.Name, dir, humanBytes(free), humanBytes(min))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d bytes", n)
}

func freeSpace(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("free space of %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// writeResults writes summary.md and loss.svg beside metrics.jsonl and
// uploads the three to results/<run>/.
func (p Params) writeResults(ctx context.Context, dir string, rc trainer.RunConfig, out Outcome, log *zap.Logger) error {
	f, err := os.Open(filepath.Join(dir, results.MetricsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("results of run %s: %w", p.Run.Name, err)
	}
	recs, err := results.ReadMetrics(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("results of run %s: %w", p.Run.Name, err)
	}
	if len(results.TrainCurve(recs)) == 0 {
		return nil
	}
	s := results.Summary{Run: p.Run.Name, Settings: Settings(p.Run, rc), Records: recs, TotalSteps: rc.TotalSteps, WallClock: out.Wall}
	fig := s.Figures()
	var bench results.BenchRow
	if mc, err := rc.ModelConfig(); err == nil {
		gpus := max(int(rc.GPUs), 0) // all: any count
		if rc.GPUs == 0 {
			gpus = 1
		}
		// The bench's step must be the run's: the optimizer's share of a
		// step shrinks with its micro-batches, and one micro-batch of
		// batch x accumulate is a different step again.
		bench = results.FindBench(p.Bench, results.Shape(mc, rc.Batch, rc.Seq, rc.Accumulate, gpus, rc.Precision))
	}
	s.Gates = []results.Gate{results.SmoothGate(recs, rc.Warmup), results.FallingGate(recs)}
	gen := results.GenerationGate(nil)
	if out.Done && p.Sample != nil && out.Checkpoint != "" {
		ids, text, err := p.Sample(ctx, out.Checkpoint)
		if err != nil {
			log.Warn("generation sample", zap.Error(err))
		} else {
			gen, s.Sample = results.GenerationGate(ids), text
		}
	}
	s.Gates = append(s.Gates, gen, results.ThroughputGate(fig.TokPerSec, bench, p.Run.Name))
	if err := s.WriteFiles(dir); err != nil {
		return err
	}
	// This segment's TensorBoard file: its lines up to out.Step, the
	// checkpoint being uploaded, from which a successor resumes if this
	// worker dies.
	events, err := results.WriteEventFile(dir, recs, out.ResumedFrom, out.Step, out.Began)
	if err != nil {
		return err
	}
	if p.Objects == nil {
		return nil
	}
	for _, name := range []string{results.MetricsFile, results.SummaryFile, results.PlotFile, events} {
		if name == "" {
			continue
		}
		if _, err := putFile(ctx, p.Objects, ResultsPrefix(p.Run.Name)+name, filepath.Join(dir, filepath.FromSlash(name))); err != nil {
			return fmt.Errorf("upload results of run %s: %w", p.Run.Name, err)
		}
	}
	return nil
}

// Settings is the configuration table of a run's summary.
func Settings(r runs.Run, rc trainer.RunConfig) []results.Setting {
	var mix []string
	for _, m := range r.RunConfig.Mixture {
		mix = append(mix, fmt.Sprintf("%s %.0f%%", m.Store, 100*m.Weight/totalWeight(r.RunConfig.Mixture)))
	}
	return []results.Setting{
		{Key: "model", Value: rc.Model},
		{Key: "seq x batch x accumulate", Value: fmt.Sprintf("%d x %d x %d = %d tokens/step", rc.Seq, rc.Batch, rc.Accumulate, rc.TokensPerStep())},
		{Key: "total steps", Value: strconv.Itoa(rc.TotalSteps)},
		{Key: "lr", Value: fmt.Sprintf("%g, warmup %d, cosine to %gx", rc.LR, rc.Warmup, rc.FloorOr())},
		{Key: "weight decay, clip", Value: fmt.Sprintf("%g, %g", rc.WeightDecay, rc.ClipOr())},
		{Key: "mixture", Value: strings.Join(mix, ", ")},
		{Key: "tokenizer", Value: r.Tokenizer},
		{Key: "engine, precision", Value: rc.Engine + ", " + rc.Precision},
		{Key: "checkpoint every", Value: fmt.Sprintf("%d steps (keep last %d, every %d)", rc.CheckpointEvery, r.Retention.KeepLast, r.Retention.KeepEvery)},
		{Key: "segment", Value: fmt.Sprintf("max %d steps, max %v", r.Segment.MaxSteps, r.Segment.MaxDuration)},
	}
}

func totalWeight(m []trainer.MixtureEntry) float64 {
	t := 0.0
	for _, e := range m {
		t += e.Weight
	}
	if t == 0 {
		return 1
	}
	return t
}
