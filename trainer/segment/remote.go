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
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
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
	Files map[string]int64 `json:"files"`
	// SHA256 lists each file's SHA-256 (hex) of the bytes uploaded:
	// trainer_state.json lists the hashes of the weights and the optimizer's
	// moments but not its own (it holds the data cursor) nor that of
	// metrics.jsonl (the run's history), and a pull checks those two too. A
	// marker written by an earlier kiln has none: its files are checked
	// against its sizes and trainer_state.json's hashes alone. A separate
	// field, not a hash beside each size in Files, so that an earlier kiln
	// still reads the markers this one writes.
	SHA256  map[string]string `json:"sha256,omitempty"`
	Written time.Time         `json:"written"`
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
	steps, _, err := remoteCheckpoints(ctx, obj, run)
	return steps, err
}

// remoteCheckpoints is RemoteSteps, with when each was marked complete:
// its marker's time in the listing.
func remoteCheckpoints(ctx context.Context, obj Objects, run string) ([]int, map[int]time.Time, error) {
	objs, err := obj.List(ctx, CheckpointPrefix(run))
	if err != nil {
		return nil, nil, fmt.Errorf("list checkpoints of run %s: %w", run, err)
	}
	var steps []int
	marked := map[int]time.Time{}
	for _, o := range objs {
		k := o.Key
		rest := strings.TrimPrefix(k, CheckpointPrefix(run))
		dir, file, ok := strings.Cut(rest, "/")
		if !ok || file != MarkerFile {
			continue
		}
		if s, ok := trainer.DirStep(dir); ok {
			steps = append(steps, s)
			marked[s] = o.Modified
		}
	}
	sort.Ints(steps)
	return steps, marked, nil
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
	m := Marker{Step: st.Step, Tokens: st.Tokens, Files: map[string]int64{}, SHA256: map[string]string{}, Kept: kept}
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
				return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run,
					fenceError{fmt.Errorf("%w: the holder of fencing token %d marked it complete, this one holds %d", scheduler.ErrRunLockLost, done.Token, m.Token)})
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
				return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, fenceError{err})
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
		m.Files[name], m.SHA256[name] = n, sum
	}
	// The run's metrics up to this step go with it, so that a worker that
	// resumes from here on another disk continues the whole history.
	if hist, err := metricsUpTo(filepath.Join(filepath.Dir(dir), results.MetricsFile), st.Step); err != nil {
		return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, err)
	} else if hist != nil {
		if err := obj.Put(ctx, prefix+results.MetricsFile, bytes.NewReader(hist), int64(len(hist))); err != nil {
			return m, fmt.Errorf("push checkpoint step %d of run %s: %w", st.Step, run, err)
		}
		sum := sha256.Sum256(hist)
		m.Files[results.MetricsFile], m.SHA256[results.MetricsFile] = int64(len(hist)), hex.EncodeToString(sum[:])
	}
	if lock != nil {
		if err := lock.Check(ctx); err != nil {
			return m, fmt.Errorf("push checkpoint step %d of run %s: not marking it complete: %w", st.Step, run, fenceError{err})
		}
	}
	m.Written = time.Now().UTC()
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := obj.Put(ctx, prefix+MarkerFile, strings.NewReader(string(b)), int64(len(b))); err != nil {
		return m, fmt.Errorf("push checkpoint step %d of run %s: marker: %w", st.Step, run, err)
	}
	return m, nil
}

// fenceError is a push stopped because the run's lease, which every write
// of a checkpoint to object storage is checked against, could not be
// confirmed: Redis did not answer, or refused, or another worker holds the
// run. Object storage is not what failed. Its message is the lease's own.
type fenceError struct{ err error }

func (e fenceError) Error() string { return e.err.Error() }
func (e fenceError) Unwrap() error { return e.err }

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
// after. One whose files do not download intact (trainer.ErrDamaged, after
// pullAttempts downloads) is left where it is, reported to damaged, and the
// one before it is tried.
func PullNewest(ctx context.Context, obj Objects, run string, after int, root string, damaged func(step int, err error)) (string, int, error) {
	steps, err := RemoteSteps(ctx, obj, run)
	if err != nil {
		return "", -1, err
	}
	return pullNewestOf(ctx, obj, run, steps, after, root, pullReport{damaged: damaged})
}

// pullReport receives what a pull of the newest checkpoint meets on its
// way: damaged, a checkpoint passed over; again, when set, a download that
// did not match and is made again.
type pullReport struct {
	damaged func(step int, err error)
	again   func(step int, err error)
}

// pullNewestOf is PullNewest among steps, the run's complete checkpoints
// in object storage as RemoteSteps lists them.
func pullNewestOf(ctx context.Context, obj Objects, run string, steps []int, after int, root string, report pullReport) (string, int, error) {
	return pullNewest(ctx, obj, run, steps, after, root, false, report)
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
	dir, step, err := pullNewest(ctx, obj, run, steps, -1, root, true, pullReport{damaged: damaged})
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

func pullNewest(ctx context.Context, obj Objects, run string, steps []int, after int, root string, weights bool, report pullReport) (string, int, error) {
	for i := len(steps) - 1; i >= 0 && steps[i] > after; i-- {
		var again func(error)
		if report.again != nil {
			step := steps[i]
			again = func(err error) { report.again(step, err) }
		}
		dir, err := pull(ctx, obj, run, steps[i], root, weights, again)
		if errors.Is(err, trainer.ErrDamaged) {
			report.damaged(steps[i], err)
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

// pullAttempts is how many times a pull downloads a checkpoint's file that
// does not match its marker or trainer_state.json before it takes the
// checkpoint as damaged. A byte changed on its way here (a proxy, a faulty
// link) is no damage to the stored copy, and passing that over for the
// checkpoint before costs every step since (thousands of the pilot's).
const pullAttempts = 3

// Pull downloads the complete checkpoint of step into root/step-NNNNNNN,
// through a temporary directory renamed into place once every file has the
// size and SHA-256 hash its marker lists (a marker written by an earlier
// kiln lists sizes alone) and the hash trainer_state.json lists
// (trainer.VerifyCheckpoint). A file that does not match is downloaded
// again, up to pullAttempts times in all, before the checkpoint counts as
// damaged. As trainer.WriteCheckpoint does, every file and the directory
// are synced before the rename and root after it, so that a power cut
// leaves either no step directory or a whole one, not one of torn files
// that the resume sets aside and downloads again.
func Pull(ctx context.Context, obj Objects, run string, step int, root string) (string, error) {
	return pull(ctx, obj, run, step, root, false, nil)
}

// pull is Pull; with weights, of every file but the optimizer's, and a
// copy under root that trainer.VerifyWeights finds whole is taken as it is.
// again, when set, hears of each download that did not match and is made
// again.
func pull(ctx context.Context, obj Objects, run string, step int, root string, weights bool, again func(error)) (string, error) {
	final := filepath.Join(root, trainer.StepDir(step))
	verify := trainer.VerifyCheckpoint
	if weights {
		verify = trainer.VerifyWeights
		if _, err := verify(final); err == nil {
			return final, nil
		}
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("pull checkpoint: %w", err)
	}
	tmp, err := os.MkdirTemp(root, pullTempPattern)
	if err != nil {
		return "", fmt.Errorf("pull checkpoint: %w", err)
	}
	defer os.RemoveAll(tmp)
	d := checkpointDownload{obj: obj, prefix: checkpointKey(run, step), dir: tmp, weights: weights,
		got: map[string]fileSum{}, seen: map[string]map[string]bool{}}
	for attempt := 1; ; attempt++ {
		err = d.pass(ctx)
		if err == nil || !errors.Is(err, trainer.ErrDamaged) || d.stored {
			break
		}
		if attempt == pullAttempts {
			err = fmt.Errorf("%w (%s)", err, d.verdict(attempt))
			break
		}
		if again != nil {
			again(err)
		}
	}
	if err != nil {
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

// fileSum is a file's size and SHA-256 (hex); an empty hash is none known.
type fileSum struct {
	size   int64
	sha256 string
}

// checkpointDownload is one pull's downloads of a checkpoint's files into
// dir, over its passes.
type checkpointDownload struct {
	obj     Objects
	prefix  string // checkpoints/<run>/step-NNNNNNN/
	dir     string
	weights bool

	// got is each file in dir as downloaded: one that matches the marker
	// read by a later pass is not downloaded again.
	got map[string]fileSum
	// seen holds the SHA-256 of every download of each file, the marker's
	// included: a file whose downloads differ changes on its way here.
	seen map[string]map[string]bool
	// stored is true once the damage is known to be the stored copy's:
	// downloading again would not change it.
	stored bool
}

// pass reads the marker and downloads the files it lists that dir lacks or
// holds with another size or hash than it lists, then checks the whole
// against trainer_state.json. Its error is trainer.ErrDamaged where what
// was downloaded does not match, which another pass may mend.
func (d *checkpointDownload) pass(ctx context.Context) error {
	b, err := d.get(ctx, MarkerFile)
	if errors.Is(err, store.ErrNotFound) {
		// Retention removed the checkpoint since it was listed.
		d.stored = true
	}
	if err != nil {
		return damagedIfMissing(err)
	}
	var m Marker
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("%s: %w", d.prefix+MarkerFile, trainer.Damaged(err))
	}
	for name := range d.got {
		if _, ok := m.Files[name]; !ok {
			// Listed by a marker an earlier pass read, changed on its way.
			delete(d.got, name)
			if err := os.Remove(filepath.Join(d.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	var mismatched []string
	for _, name := range slices.Sorted(maps.Keys(m.Files)) {
		want := fileSum{size: m.Files[name], sha256: m.SHA256[name]}
		if name != filepath.Base(name) || name == "." || name == ".." || name == MarkerFile {
			// Written so by no kiln: changed on its way here, or in the store.
			return trainer.Damaged(fmt.Errorf("%s lists a bad file name %q", MarkerFile, name))
		}
		if d.weights && name == trainer.OptimizerFile {
			continue
		}
		if got, ok := d.got[name]; ok && got.size == want.size && (want.sha256 == "" || got.sha256 == want.sha256) {
			continue
		}
		got, err := d.getFile(ctx, name)
		if err != nil {
			// A file the marker lists and the store does not hold: a name
			// changed on its way here, or a file removed; the next pass
			// reads the marker again.
			return fmt.Errorf("%s: %w", name, damagedIfMissing(err))
		}
		switch {
		case got.size != want.size:
			// Read whole (no error) and still short or long: another copy
			// than the one uploaded, stored or on its way here.
			mismatched = append(mismatched, fmt.Sprintf("%s is %d bytes, the marker says %d", name, got.size, want.size))
		case want.sha256 != "" && got.sha256 != want.sha256:
			mismatched = append(mismatched, fmt.Sprintf("%s has SHA-256 %s, the marker says %s", name, got.sha256, want.sha256))
		}
	}
	if len(mismatched) > 0 {
		return trainer.Damaged(errors.New(strings.Join(mismatched, "; ")))
	}
	// The files were hashed as they arrived: trainer_state.json's hashes
	// are checked against those, not read again.
	sums := map[string]string{}
	for name, got := range d.got {
		sums[name] = got.sha256
	}
	if _, err := trainer.VerifyHashed(d.dir, !d.weights, sums); err != nil {
		if !errors.Is(err, trainer.ErrDamaged) {
			return err
		}
		if len(m.SHA256) > 0 {
			// Every file downloaded is as uploaded, and they do not agree
			// with trainer_state.json: the checkpoint was stored so.
			d.stored = true
			return err
		}
		// A marker of an earlier kiln says which file differs from its
		// upload by size alone: every one is downloaded again.
		clear(d.got)
		return err
	}
	return nil
}

// get reads the checkpoint's object name whole, noting its hash.
func (d *checkpointDownload) get(ctx context.Context, name string) ([]byte, error) {
	r, err := d.obj.Get(ctx, d.prefix+name)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	// A transfer cut off fails here, and is no damage (the segment is
	// retried).
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.prefix+name, err)
	}
	sum := sha256.Sum256(b)
	d.note(name, hex.EncodeToString(sum[:]))
	return b, nil
}

// getFile downloads the checkpoint's file name into dir, hashing it as it
// arrives.
func (d *checkpointDownload) getFile(ctx context.Context, name string) (fileSum, error) {
	delete(d.got, name)
	n, sum, err := getFile(ctx, d.obj, d.prefix+name, filepath.Join(d.dir, name))
	if err != nil {
		return fileSum{}, err
	}
	got := fileSum{size: n, sha256: sum}
	d.got[name] = got
	d.note(name, sum)
	return got, nil
}

func (d *checkpointDownload) note(name, sum string) {
	if d.seen[name] == nil {
		d.seen[name] = map[string]bool{}
	}
	d.seen[name][sum] = true
}

// verdict says what attempts passes that never matched tell of where the
// bytes changed.
func (d *checkpointDownload) verdict(attempts int) string {
	for _, name := range slices.Sorted(maps.Keys(d.seen)) {
		if len(d.seen[name]) > 1 {
			return fmt.Sprintf("downloaded %d times, and %s came with other bytes from one download to the next: something between here and the store (a proxy, a faulty link) changes what is downloaded, and the stored copy may be intact", attempts, name)
		}
	}
	return fmt.Sprintf("downloaded %d times, alike each time: the stored copy differs from the one uploaded, or something between here and the store (a proxy) changes it alike each time", attempts)
}

// StoredState reads the trainer_state.json of run's checkpoint of step in
// object storage, for a check of a resume made before any download (sched
// enqueue train); ok is false where there is none, or where it is not the
// one its marker lists (damaged since it was uploaded), which a pull
// passes over for an earlier checkpoint.
func StoredState(ctx context.Context, obj Objects, run string, step int) (st trainer.State, ok bool, err error) {
	prefix := checkpointKey(run, step)
	r, err := obj.Get(ctx, prefix+trainer.StateFile)
	if errors.Is(err, store.ErrNotFound) {
		return st, false, nil
	}
	if err != nil {
		return st, false, err
	}
	defer r.Close()
	// It holds the data cursor: kilobytes, a few megabytes for a mixture
	// of many stores.
	b, err := io.ReadAll(io.LimitReader(r, 64<<20))
	if err != nil {
		return st, false, fmt.Errorf("%s: %w", prefix+trainer.StateFile, err)
	}
	var m Marker
	if getJSON(ctx, obj, prefix+MarkerFile, &m) == nil {
		if want := m.SHA256[trainer.StateFile]; want != "" {
			if sum := sha256.Sum256(b); !strings.EqualFold(hex.EncodeToString(sum[:]), want) {
				return st, false, nil
			}
		}
	}
	if json.Unmarshal(b, &st) != nil || st.Step != step {
		return trainer.State{}, false, nil
	}
	return st, true, nil
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

// getFile downloads key to path, and returns its size and the SHA-256
// (hex) of the bytes received.
func getFile(ctx context.Context, obj Objects, key, path string) (int64, string, error) {
	r, err := obj.Get(ctx, key)
	if err != nil {
		return 0, "", err
	}
	defer r.Close()
	f, err := os.Create(path)
	if err != nil {
		return 0, "", err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return n, hex.EncodeToString(h.Sum(nil)), err
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
