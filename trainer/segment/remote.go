package segment

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
)

// Objects is the object store a segment pushes to and pulls from: S3 in
// the compose stack, a local directory in the demo.
type Objects = store.Store

// MarkerFile is the completion marker of a checkpoint in object storage,
// written after every other file of it: a checkpoint directory without one
// is an upload that did not finish and is never resumed from.
const MarkerFile = "_COMPLETE.json"

// Marker is the marker's content.
type Marker struct {
	Step   int   `json:"step"`
	Tokens int64 `json:"tokens_seen"`
	// Token is the fencing token of the worker that wrote the checkpoint.
	Token int64 `json:"fencing_token"`
	// Files lists the checkpoint's files and sizes, so that a download can
	// be checked before it is used.
	Files   map[string]int64 `json:"files"`
	Written time.Time        `json:"written"`
	// Kept says that retention keeps the checkpoint for good (keep_every),
	// as decided when it was written: a checkpoint_every changed later
	// does not make it prunable.
	Kept bool `json:"kept,omitempty"`
}

// CheckpointPrefix is checkpoints/<run>/ in object storage.
func CheckpointPrefix(run string) string { return "checkpoints/" + run + "/" }

// ResultsPrefix is results/<run>/ in object storage.
func ResultsPrefix(run string) string { return "results/" + run + "/" }

func checkpointKey(run string, step int) string {
	return CheckpointPrefix(run) + trainer.StepDir(step) + "/"
}

// RemoteSteps lists the steps of the run's complete checkpoints in object
// storage, in increasing order.
func RemoteSteps(ctx context.Context, obj Objects, run string) ([]int, error) {
	objs, err := obj.List(ctx, CheckpointPrefix(run))
	if err != nil {
		return nil, fmt.Errorf("list checkpoints of run %s: %w", run, err)
	}
	var steps []int
	for _, o := range objs {
		k := o.Key
		rest := strings.TrimPrefix(k, CheckpointPrefix(run))
		dir, file, ok := strings.Cut(rest, "/")
		if !ok || file != MarkerFile {
			continue
		}
		if s, ok := trainer.DirStep(dir); ok {
			steps = append(steps, s)
		}
	}
	sort.Ints(steps)
	return steps, nil
}

// RemoteRuns lists every run object storage holds a complete checkpoint
// of, with the step of its newest, from one listing of checkpoints/: what
// says where a run is when Redis has lost its record of it.
func RemoteRuns(ctx context.Context, obj Objects) (map[string]int, error) {
	const prefix = "checkpoints/"
	objs, err := obj.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("list checkpoints: %w", err)
	}
	newest := map[string]int{}
	for _, o := range objs {
		parts := strings.Split(strings.TrimPrefix(o.Key, prefix), "/")
		if len(parts) != 3 || parts[2] != MarkerFile {
			continue
		}
		if s, ok := trainer.DirStep(parts[1]); ok {
			if n, seen := newest[parts[0]]; !seen || s > n {
				newest[parts[0]] = s
			}
		}
	}
	return newest, nil
}

// Push uploads the local checkpoint dir (a complete one: trainer writes
// trainer_state.json last and renames the directory into place) to
// checkpoints/<run>/step-NNNNNNN/, then, only if lock still holds, writes
// the completion marker. Files go up in a fixed order with
// trainer_state.json last, so that even without the marker a reader of the
// prefix sees the trainer's own completeness rule respected.
//
// Each file is hashed as it goes up and checked against
// trainer_state.json: a checkpoint damaged on this disk since it was
// written is never marked complete (errors.Is trainer.ErrDamaged).
func Push(ctx context.Context, obj Objects, lock Lease, run, dir string) (Marker, error) {
	return push(ctx, obj, lock, run, dir, false)
}

// push is Push, with the marker saying whether retention keeps the
// checkpoint for good.
func push(ctx context.Context, obj Objects, lock Lease, run, dir string, kept bool) (Marker, error) {
	st, err := trainer.CheckCheckpoint(dir)
	if err != nil {
		return Marker{}, fmt.Errorf("push %s: %w", dir, err)
	}
	m := Marker{Step: st.Step, Tokens: st.Tokens, Files: map[string]int64{}, Kept: kept}
	if lock != nil {
		m.Token = lock.Token()
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return m, fmt.Errorf("push %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != trainer.StateFile {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	names = append(names, trainer.StateFile)
	prefix := checkpointKey(run, st.Step)
	if lock != nil {
		// A holder of the run that lost its lease (it froze past it) must
		// not write into a checkpoint the newer holder marked complete. A
		// marker of a larger token whose holder is not newer, this one's
		// lease holding in Redis, was written before Redis lost its data
		// (its fencing counters start again at 1): the step trained again
		// (its copy there damaged) is this holder's to mark.
		var done Marker
		err := getJSON(ctx, obj, prefix+MarkerFile, &done)
		switch {
		case err == nil && done.Token > m.Token:
			if lerr := lock.Check(ctx); lerr != nil {
				return m, fmt.Errorf("push checkpoint step %d of run %s: %w: the holder of fencing token %d marked it complete, this one holds %d",
					st.Step, run, scheduler.ErrRunLockLost, done.Token, m.Token)
			}
		case err != nil && !errors.Is(err, store.ErrNotFound) && !errors.Is(err, trainer.ErrDamaged):
			return m, fmt.Errorf("push checkpoint step %d of run %s: read its marker: %w", st.Step, run, err)
		}
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		if lock != nil {
			// The lease checked before every file, not only before the
			// marker: a holder fenced out stops writing at once.
			if err := lock.Check(ctx); err != nil {
				return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, err)
			}
		}
		n, sum, err := putFile(ctx, obj, prefix+name, filepath.Join(dir, name))
		if err != nil {
			return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, err)
		}
		if want, ok := st.Files[name]; ok && sum != want.SHA256 {
			return m, fmt.Errorf("push checkpoint step %d of run %s: not marking it complete: %w", st.Step, run,
				trainer.Damaged(fmt.Errorf("%s has SHA-256 %s on this disk, its %s says %s (damaged since it was written)", filepath.Join(dir, name), sum, trainer.StateFile, want.SHA256)))
		}
		m.Files[name] = n
	}
	// The run's metrics up to this step go with it, so that a worker that
	// resumes from here on another disk continues the whole history.
	if hist, err := metricsUpTo(filepath.Join(filepath.Dir(dir), results.MetricsFile), st.Step); err != nil {
		return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, err)
	} else if hist != nil {
		if err := obj.Put(ctx, prefix+results.MetricsFile, bytes.NewReader(hist), int64(len(hist))); err != nil {
			return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, err)
		}
		m.Files[results.MetricsFile] = int64(len(hist))
	}
	if lock != nil {
		if err := lock.Check(ctx); err != nil {
			return m, fmt.Errorf("push checkpoint step %d of run %s: not marking it complete: %w", st.Step, run, err)
		}
	}
	m.Written = time.Now().UTC()
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := obj.Put(ctx, prefix+MarkerFile, strings.NewReader(string(b)), int64(len(b))); err != nil {
		return m, fmt.Errorf("push checkpoint step %d of run %s: marker: %w", st.Step, run, err)
	}
	return m, nil
}

// putFile uploads the file at path to key, and returns its size and the
// SHA-256 (hex) of the bytes sent.
func putFile(ctx context.Context, obj Objects, key, path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, "", err
	}
	// A file still being appended (metrics.jsonl) is sent as it was when
	// stat'ed, so the size the store is told stays true.
	h := sha256.New()
	if err := obj.Put(ctx, key, io.TeeReader(io.LimitReader(f, fi.Size()), h), fi.Size()); err != nil {
		return 0, "", err
	}
	return fi.Size(), hex.EncodeToString(h.Sum(nil)), nil
}

// metricsUpTo returns the complete lines of the metrics file at path whose
// step is at most step, or nil when there is no such file.
func metricsUpTo(path string, step int) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		var r struct {
			Step *int `json:"step"`
		}
		if !bytes.HasSuffix(line, []byte("\n")) || json.Unmarshal(line, &r) != nil || r.Step == nil || *r.Step > step {
			continue
		}
		out = append(out, line...)
	}
	return out, nil
}

// PullNewest pulls the newest complete checkpoint of run in object storage
// whose step is above after into root (see Pull), and returns its
// directory and step, or "" and -1 when object storage holds none above
// after. One whose files turn out damaged (trainer.ErrDamaged) is left where
// it is, reported to damaged, and the one before it is tried.
func PullNewest(ctx context.Context, obj Objects, run string, after int, root string, damaged func(step int, err error)) (string, int, error) {
	steps, err := RemoteSteps(ctx, obj, run)
	if err != nil {
		return "", -1, err
	}
	return pullNewestOf(ctx, obj, run, steps, after, root, damaged)
}

// pullNewestOf is PullNewest among steps, the run's complete checkpoints
// in object storage as RemoteSteps lists them.
func pullNewestOf(ctx context.Context, obj Objects, run string, steps []int, after int, root string, damaged func(step int, err error)) (string, int, error) {
	return pullNewest(ctx, obj, run, steps, after, root, false, damaged)
}

// PullNewestWeights is PullNewest for sampling from the run: it pulls
// every file of the newest whole checkpoint but the optimizer's (two
// thirds of its bytes, which sampling never reads), takes a copy already
// under root that VerifyWeights finds whole instead of downloading it
// again, and then removes the older copies under root. Processes pulling
// the same checkpoint at once each end with the one whole copy.
func PullNewestWeights(ctx context.Context, obj Objects, run, root string, damaged func(step int, err error)) (string, int, error) {
	steps, err := RemoteSteps(ctx, obj, run)
	if err != nil {
		return "", -1, err
	}
	dir, step, err := pullNewest(ctx, obj, run, steps, -1, root, true, damaged)
	if err != nil || dir == "" {
		return dir, step, err
	}
	entries, _ := os.ReadDir(root) // what cannot be listed is left
	for _, e := range entries {
		if s, ok := trainer.DirStep(e.Name()); ok && e.IsDir() && s < step {
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	return dir, step, nil
}

func pullNewest(ctx context.Context, obj Objects, run string, steps []int, after int, root string, weights bool, damaged func(step int, err error)) (string, int, error) {
	for i := len(steps) - 1; i >= 0 && steps[i] > after; i-- {
		dir, err := pull(ctx, obj, run, steps[i], root, weights)
		if errors.Is(err, trainer.ErrDamaged) {
			damaged(steps[i], err)
			continue
		}
		if err != nil {
			return "", -1, err
		}
		return dir, steps[i], nil
	}
	return "", -1, nil
}

// pullTempPattern names the directory a pull downloads into before it is
// renamed into place.
const pullTempPattern = ".pull-step-*"

// Pull downloads the complete checkpoint of step into root/step-NNNNNNN,
// through a temporary directory renamed into place once every file has the
// size its marker lists and the hash trainer_state.json lists
// (trainer.VerifyCheckpoint). As trainer.WriteCheckpoint does, every file
// and the directory are synced before the rename and root after it, so
// that a power cut leaves either no step directory or a whole one, not
// one of torn files that the resume sets aside and downloads again.
func Pull(ctx context.Context, obj Objects, run string, step int, root string) (string, error) {
	return pull(ctx, obj, run, step, root, false)
}

// pull is Pull; with weights, of every file but the optimizer's, and a
// copy under root that trainer.VerifyWeights finds whole is taken as it is.
func pull(ctx context.Context, obj Objects, run string, step int, root string, weights bool) (string, error) {
	final := filepath.Join(root, trainer.StepDir(step))
	verify := trainer.VerifyCheckpoint
	if weights {
		verify = trainer.VerifyWeights
		if _, err := verify(final); err == nil {
			return final, nil
		}
	}
	prefix := checkpointKey(run, step)
	var m Marker
	if err := getJSON(ctx, obj, prefix+MarkerFile, &m); err != nil {
		return "", fmt.Errorf("pull checkpoint step %d of run %s: %w", step, run, damagedIfMissing(err))
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("pull checkpoint: %w", err)
	}
	tmp, err := os.MkdirTemp(root, pullTempPattern)
	if err != nil {
		return "", fmt.Errorf("pull checkpoint: %w", err)
	}
	defer os.RemoveAll(tmp)
	for name, size := range m.Files {
		if name != filepath.Base(name) || name == "." || name == ".." {
			return "", fmt.Errorf("pull checkpoint step %d of run %s: marker lists a bad file name %q", step, run, name)
		}
		if weights && name == trainer.OptimizerFile {
			continue
		}
		got, err := getFile(ctx, obj, prefix+name, filepath.Join(tmp, name))
		if err != nil {
			return "", fmt.Errorf("pull checkpoint step %d of run %s: %s: %w", step, run, name, damagedIfMissing(err))
		}
		if got != size {
			// Read whole (no error) and still short or long: the object is
			// a partial copy, not a transfer cut off.
			return "", trainer.Damaged(fmt.Errorf("pull checkpoint step %d of run %s: %s is %d bytes, the marker says %d", step, run, name, got, size))
		}
	}
	if _, err := verify(tmp); err != nil {
		return "", fmt.Errorf("pull checkpoint step %d of run %s: %w", step, run, err)
	}
	if err := trainer.SyncDir(tmp); err != nil {
		return "", fmt.Errorf("pull checkpoint step %d of run %s: %w", step, run, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		// A copy is there: another process's pull of the same step,
		// renamed into place since, is whole and may be in use; one that
		// is not whole is replaced.
		if _, verr := verify(final); verr == nil {
			return final, nil
		}
		if err := os.RemoveAll(final); err != nil {
			return "", fmt.Errorf("pull checkpoint: %w", err)
		}
		if err := os.Rename(tmp, final); err != nil {
			return "", fmt.Errorf("pull checkpoint: %w", err)
		}
	}
	if err := trainer.SyncDir(root); err != nil {
		return "", fmt.Errorf("pull checkpoint step %d of run %s: %w", step, run, err)
	}
	return final, nil
}

func getJSON(ctx context.Context, obj Objects, key string, v any) error {
	r, err := obj.Get(ctx, key)
	if err != nil {
		return err
	}
	defer r.Close()
	// Read whole first: a transfer cut off fails here, and is no damage
	// (the segment is retried); what was read whole and does not decode
	// as its JSON (empty, cut short where it was written, another kind)
	// was written wrong, and the checkpoint is passed over.
	b, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", key, trainer.Damaged(err))
	}
	return nil
}

// damagedIfMissing marks an object that object storage does not hold as a
// damaged checkpoint (a file of it deleted, or the checkpoint removed by
// retention since it was listed): the one before it is taken. Other errors
// (the store unreachable, a transfer cut off) stay what they are, so that
// the segment fails and is retried rather than go back a checkpoint.
func damagedIfMissing(err error) error {
	if errors.Is(err, store.ErrNotFound) {
		return trainer.Damaged(err)
	}
	return err
}

func getFile(ctx context.Context, obj Objects, key, path string) (int64, error) {
	r, err := obj.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// Keep reports which checkpoint steps retention keeps: the last keepLast,
// and every one whose number (step / every, every being the run's
// checkpoint interval) is a multiple of keepEvery.
func Keep(steps []int, every, keepLast, keepEvery int) map[int]bool {
	keep := map[int]bool{}
	for i, s := range steps {
		if i >= len(steps)-keepLast {
			keep[s] = true
		}
		if keepEvery > 0 && every > 0 && s%every == 0 && (s/every)%keepEvery == 0 && s > 0 {
			keep[s] = true
		}
	}
	return keep
}

// Prune deletes the run's checkpoints in object storage up to step upTo
// that retention does not keep, counting the last keepLast among those:
// the newest this segment uploaded or resumed from. A complete one above
// upTo is not this history's newest (a damaged checkpoint a resume passed
// over, or a fenced-out holder's): it is left alone and counts for
// nothing, so that it never pushes a good one out. One whose marker says
// it is kept for good stays whatever checkpoint_every is now. The marker
// goes first, so that a checkpoint whose deletion is interrupted is
// already incomplete and never resumed from. Directories without a marker
// older than the newest complete checkpoint are abandoned uploads and go
// too.
func Prune(ctx context.Context, obj Objects, run string, upTo, every, keepLast, keepEvery int) ([]int, error) {
	objs, err := obj.List(ctx, CheckpointPrefix(run))
	if err != nil {
		return nil, fmt.Errorf("prune checkpoints of run %s: %w", run, err)
	}
	files := map[int][]string{}
	complete := map[int]bool{}
	var steps []int
	for _, o := range objs {
		k := o.Key
		dir, file, ok := strings.Cut(strings.TrimPrefix(k, CheckpointPrefix(run)), "/")
		s, sok := trainer.DirStep(dir)
		if !ok || !sok {
			continue
		}
		files[s] = append(files[s], k)
		if file == MarkerFile {
			complete[s] = true
			if s <= upTo {
				steps = append(steps, s)
			}
		}
	}
	sort.Ints(steps)
	if len(steps) == 0 {
		return nil, nil
	}
	newest := steps[len(steps)-1]
	keep := Keep(steps, every, keepLast, keepEvery)
	var deleted []int
	for s, ks := range files {
		if keep[s] || s > upTo || (!complete[s] && s >= newest) {
			continue
		}
		if complete[s] {
			var m Marker
			err := getJSON(ctx, obj, checkpointKey(run, s)+MarkerFile, &m)
			switch {
			case errors.Is(err, trainer.ErrDamaged):
				// Its marker does not say whether it is kept for good: it
				// stays, and the others are pruned as ever.
				continue
			case err != nil && !errors.Is(err, store.ErrNotFound):
				return deleted, fmt.Errorf("prune checkpoint step %d of run %s: read its marker: %w", s, run, err)
			}
			if m.Kept {
				continue
			}
		}
		// The marker first; path.Base of the marker key is MarkerFile.
		sort.Slice(ks, func(i, j int) bool { return path.Base(ks[i]) == MarkerFile && path.Base(ks[j]) != MarkerFile })
		for _, k := range ks {
			if err := obj.Delete(ctx, k); err != nil {
				return deleted, fmt.Errorf("prune checkpoint step %d of run %s: %w", s, run, err)
			}
		}
		deleted = append(deleted, s)
	}
	sort.Ints(deleted)
	return deleted, nil
}

// ErrNoRemote is returned when object storage holds no complete checkpoint.
var ErrNoRemote = errors.New("no complete checkpoint in object storage")
