package trainer

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/disk"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/tokens"
	"go.uber.org/zap"
)

// Checkpoint file names (docs/operations.md says what a resume checks).
// config.json,
// model.safetensors and tokenizer.json are what transformers' from_pretrained
// reads; the other two are kiln's own.
const (
	ConfigFile     = "config.json"
	ModelFile      = "model.safetensors"
	TokenizerFile  = "tokenizer.json"
	OptimizerFile  = "optimizer.safetensors"
	StateFile      = "trainer_state.json"
	stateFormat    = "kiln.trainer_state"
	stateVersion   = 1
	stepDirPrefix  = "step-"
	stepDirDigits  = 7
	tempDirPattern = ".tmp-step-*"
)

// StepDir is the directory name of the checkpoint after step.
func StepDir(step int) string { return fmt.Sprintf("%s%0*d", stepDirPrefix, stepDirDigits, step) }

// State is trainer_state.json: everything beside the weights and the
// optimizer moments that a run needs to continue exactly where it stopped.
// It is written last, and lists the size and SHA-256 of every other file,
// so that a checkpoint whose files do not match it is not taken for valid.
type State struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Step is the number of optimizer steps taken; Tokens the number of
	// target tokens trained on.
	Step   int   `json:"step"`
	Tokens int64 `json:"tokens_seen"`
	// Cursor is the data sampler's position after the last step.
	Cursor json.RawMessage `json:"data_cursor"`
	// RNG is the seed everything random in a run derives from: the initial
	// weights and the sampler's permutations. The loop draws no other
	// random numbers, so the seed and the cursor restore the whole stream.
	RNG  RNGState  `json:"rng"`
	Run  RunConfig `json:"run_config"`
	Loss float64   `json:"loss"`
	// TokenizerName is what the run called its tokenizer.json (a published
	// tokenizer's name, or the file it was read from), so that a resume
	// refused for another tokenizer can say which one to give; empty when
	// the checkpoint has no tokenizer.json or the run gave no name.
	TokenizerName string `json:"tokenizer_name,omitempty"`
	// WallClock is the run's wall-clock up to this checkpoint, in seconds,
	// over all its segments: a run whose record in Redis was lost carries
	// its sum on from the checkpoint it resumes from. 0 (absent) in a
	// checkpoint written before it was recorded.
	WallClock float64 `json:"wall_clock_s,omitempty"`
	// Files maps each other file of the checkpoint to its size and hash.
	Files map[string]FileSum `json:"files"`
}

// Wall is s's WallClock as a duration.
func (s State) Wall() time.Duration { return time.Duration(s.WallClock * float64(time.Second)) }

// RNGState records the run's random seed.
type RNGState struct {
	Seed uint64 `json:"seed"`
}

// FileSum is a file's size and SHA-256.
type FileSum struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Snapshot is what a checkpoint holds, in memory.
type Snapshot struct {
	Config    model.Config
	Params    *model.Params
	Optimizer *model.OptimizerState
	// Tokenizer is the bytes of tokenizer.json, copied as is; nil when the
	// run has none (tests), and then the file is absent.
	Tokenizer []byte
	State     State
}

// WriteCheckpoint writes s as root/step-NNNNNNN: into a temporary directory
// beside it, every file synced, trainer_state.json last, then renamed into
// place and the parent synced. A crash at any point leaves either no
// step directory or a complete one; a stale temporary directory is never
// read, and is removed by the next write.
//
// A disk that fills up meanwhile is named in the error with what it has
// free and what the checkpoint needs: the earlier checkpoints stay whole.
func WriteCheckpoint(ctx context.Context, root string, s *Snapshot) (string, error) {
	dir, err := writeCheckpoint(ctx, root, s)
	if errors.Is(err, syscall.ENOSPC) {
		// The temporary directory is removed by now: what is free is
		// what the disk had for this checkpoint.
		need := 12*int64(len(s.Params.Data)) + int64(len(s.Tokenizer))
		free := "too little"
		if n, ferr := disk.Free(root); ferr == nil {
			free = bytesize.Format(n)
		}
		err = fmt.Errorf("%w: the disk of %s has %s free and a checkpoint of this model takes about %s (weights and Adam moments): "+
			"free space on it, or write the run to another disk; the checkpoints before this one are whole", err, root, free, bytesize.Format(need))
	}
	return dir, err
}

func writeCheckpoint(ctx context.Context, root string, s *Snapshot) (string, error) {
	final := filepath.Join(root, StepDir(s.State.Step))
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	removeStaleTemps(root)
	tmp, err := os.MkdirTemp(root, tempDirPattern)
	if err != nil {
		return "", fmt.Errorf("write checkpoint: %w", err)
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()

	st := s.State
	st.Format, st.Version = stateFormat, stateVersion
	st.Files = map[string]FileSum{}
	put := func(name string, write func(io.Writer) error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		sum, err := writeSynced(filepath.Join(tmp, name), write)
		if err != nil {
			return fmt.Errorf("write checkpoint %s: %s: %w", final, name, err)
		}
		st.Files[name] = sum
		return nil
	}
	cfg, err := model.MarshalConfig(s.Config)
	if err != nil {
		return "", fmt.Errorf("write checkpoint %s: config: %w", final, err)
	}
	if err := put(ConfigFile, func(w io.Writer) error { _, err := w.Write(cfg); return err }); err != nil {
		return "", err
	}
	mf, err := model.ParamsFile(s.Params, model.F32)
	if err != nil {
		return "", fmt.Errorf("write checkpoint %s: %w", final, err)
	}
	if err := putEncoded(put, ModelFile, mf); err != nil {
		return "", err
	}
	if s.Tokenizer != nil {
		if err := put(TokenizerFile, func(w io.Writer) error { _, err := w.Write(s.Tokenizer); return err }); err != nil {
			return "", err
		}
	}
	if err := putEncoded(put, OptimizerFile, optimizerFile(s.Params, s.Optimizer)); err != nil {
		return "", err
	}
	state, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return "", err
	}
	if _, err := writeSynced(filepath.Join(tmp, StateFile), func(w io.Writer) error { _, err := w.Write(state); return err }); err != nil {
		return "", fmt.Errorf("write checkpoint %s: %s: %w", final, StateFile, err)
	}
	if err := SyncDir(tmp); err != nil {
		return "", fmt.Errorf("write checkpoint %s: %w", final, err)
	}
	// A checkpoint of this step may exist from a run that stopped after
	// writing it and was resumed from an earlier one; the new one replaces it.
	if err := os.RemoveAll(final); err != nil {
		return "", fmt.Errorf("write checkpoint %s: %w", final, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("write checkpoint %s: %w", final, err)
	}
	done = true
	if err := SyncDir(root); err != nil {
		return "", fmt.Errorf("write checkpoint %s: %w", final, err)
	}
	return final, nil
}

// putEncoded writes a safetensors file through put.
func putEncoded(put func(string, func(io.Writer) error) error, name string, f *model.SafetensorsFile) error {
	b, err := model.EncodeSafetensors(f)
	if err != nil {
		return err
	}
	return put(name, func(w io.Writer) error { _, err := w.Write(b); return err })
}

// Suffixes of the Adam moments in optimizer.safetensors, after the
// parameter's HF name, as torch's AdamW names its state.
const (
	expAvg   = ".exp_avg"
	expAvgSq = ".exp_avg_sq"
)

// optimizerFile lays the Adam moments out under the parameter names, with
// the step count (for bias correction) in the metadata.
func optimizerFile(p *model.Params, o *model.OptimizerState) *model.SafetensorsFile {
	f := &model.SafetensorsFile{Metadata: map[string]string{"format": "kiln.adamw", "step": strconv.Itoa(o.Step)}}
	off := 0
	for _, s := range p.Specs() {
		n := s.Elements()
		f.Tensors = append(f.Tensors,
			model.F32Tensor(s.Name+expAvg, s.Shape, o.M[off:off+n]),
			model.F32Tensor(s.Name+expAvgSq, s.Shape, o.V[off:off+n]))
		off += n
	}
	return f
}

// writeSynced writes a file through a buffer, syncs it, and returns its
// size and SHA-256.
func writeSynced(path string, write func(io.Writer) error) (FileSum, error) {
	f, err := os.Create(path)
	if err != nil {
		return FileSum{}, err
	}
	defer f.Close()
	h := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(f, h)}
	bw := bufio.NewWriterSize(cw, 1<<20)
	if err := write(bw); err != nil {
		return FileSum{}, err
	}
	if err := bw.Flush(); err != nil {
		return FileSum{}, err
	}
	if err := f.Sync(); err != nil {
		return FileSum{}, err
	}
	if err := f.Close(); err != nil {
		return FileSum{}, err
	}
	return FileSum{Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// SyncDir syncs a directory, so that the names made or renamed in it
// outlive a power cut.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func removeStaleTemps(root string) {
	stale, _ := filepath.Glob(filepath.Join(root, tempDirPattern))
	for _, d := range stale {
		os.RemoveAll(d)
	}
}

// ErrNoCheckpoint is returned by LatestCheckpoint when root holds none.
var ErrNoCheckpoint = errors.New("no checkpoint")

// ErrDamaged marks a checkpoint whose files are missing, cut short, or of
// another size or hash than trainer_state.json lists. A checkpoint is
// complete when its directory appears (WriteCheckpoint renames it into
// place), so one that is not was damaged since: a disk error, a partial
// copy, a file edited by hand. A resume sets it aside and continues from
// the one before it.
var ErrDamaged = errors.New("damaged checkpoint")

type damagedError struct{ err error }

func (e damagedError) Error() string        { return e.err.Error() }
func (e damagedError) Unwrap() error        { return e.err }
func (e damagedError) Is(target error) bool { return target == ErrDamaged }

func damaged(format string, a ...any) error { return damagedError{fmt.Errorf(format, a...)} }

// Damaged marks err as saying a checkpoint is damaged (errors.Is
// ErrDamaged), for the checks made outside this package: a copy in object
// storage with a file missing or of another size than its marker lists.
func Damaged(err error) error { return damagedError{err} }

// HoldsCheckpoint reports whether dir is a checkpoint training wrote,
// whole or damaged: it holds a trainer_state.json.
func HoldsCheckpoint(dir string) bool {
	_, err := os.Lstat(filepath.Join(dir, StateFile))
	return err == nil
}

// CheckCheckpoint reports why dir is not a complete checkpoint: its
// trainer_state.json is missing or unreadable, or a file it lists is absent
// or of another size (errors.Is ErrDamaged), or it is of a format this build
// does not read. It reads no file in full; VerifyCheckpoint and
// ReadCheckpoint also check every hash.
func CheckCheckpoint(dir string) (State, error) { return checkCheckpoint(dir, true) }

// checkCheckpoint is CheckCheckpoint, the optimizer's file left
// unlooked-at unless withOptimizer (it is listed all the same).
func checkCheckpoint(dir string, withOptimizer bool) (State, error) {
	var st State
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return st, notRead(dir, err, "checkpoint %s is incomplete (%w): it was not written to the end; use an earlier one", dir, err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, damaged("checkpoint %s: %s is not valid JSON (%v): use an earlier checkpoint", dir, StateFile, err)
	}
	switch {
	case st.Format != stateFormat:
		return st, fmt.Errorf("checkpoint %s: %s is format %q, not a kiln checkpoint's %q: point at a directory kiln wrote", dir, StateFile, st.Format, stateFormat)
	case st.Version > stateVersion:
		return st, fmt.Errorf("checkpoint %s: %s is version %d, written by a newer kiln than this one (it reads version %d): resume with that kiln or a newer one", dir, StateFile, st.Version, stateVersion)
	case st.Version != stateVersion:
		return st, fmt.Errorf("checkpoint %s: %s is version %d, which this kiln does not read (it reads version %d): resume with the kiln that wrote it", dir, StateFile, st.Version, stateVersion)
	}
	// trainer_state.json lists the other files' hashes but has none of its
	// own: values no run writes mean it was damaged or edited.
	if st.Step < 0 || st.Tokens < 0 {
		return st, damaged("checkpoint %s: %s says step %d, %d tokens seen, which no run writes (damaged or edited): use an earlier checkpoint", dir, StateFile, st.Step, st.Tokens)
	}
	if st.WallClock < 0 {
		return st, damaged("checkpoint %s: %s says a wall-clock of %gs, which no run writes (damaged or edited): use an earlier checkpoint", dir, StateFile, st.WallClock)
	}
	if step, ok := DirStep(filepath.Base(dir)); ok && step != st.Step {
		return st, damaged("checkpoint %s: %s says step %d, its directory's name step %d (damaged, edited, or renamed by hand): use an earlier checkpoint", dir, StateFile, st.Step, step)
	}
	for _, name := range []string{ConfigFile, ModelFile, OptimizerFile} {
		if _, ok := st.Files[name]; !ok {
			return st, damaged("checkpoint %s: %s does not list %s: use an earlier checkpoint", dir, StateFile, name)
		}
	}
	for name, sum := range st.Files {
		if name == OptimizerFile && !withOptimizer {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return st, notRead(dir, err, "checkpoint %s is incomplete: %w; use an earlier one", dir, err)
		}
		switch {
		case fi.Size() < sum.Size:
			return st, damaged("checkpoint %s: %s is %d bytes, %s says %d (truncated?): use an earlier checkpoint", dir, name, fi.Size(), StateFile, sum.Size)
		case fi.Size() > sum.Size:
			// No write cut short makes a file longer: it was edited or
			// replaced since.
			return st, damaged("checkpoint %s: %s is %d bytes, %s says %d: it was changed after the checkpoint was written (it grew): use an earlier checkpoint", dir, name, fi.Size(), StateFile, sum.Size)
		}
	}
	return st, nil
}

// notRead is the error for a file of checkpoint dir that err says could
// not be read: damage, as format and a say, except where this process may
// not read it (another user wrote it: checkpoint directories are private
// to their writer). Such a checkpoint is not damaged and is never set
// aside: the user runs as its writer, or gives this one access.
func notRead(dir string, err error, format string, a ...any) error {
	if errors.Is(err, fs.ErrPermission) {
		return badInput(fmt.Errorf("checkpoint %s cannot be read by this user (%w); it is not damaged: run as the user that wrote it, or give this one access to it (chown -R)", dir, err))
	}
	return damaged(format, a...)
}

// VerifyCheckpoint is CheckCheckpoint that also reads every file and checks
// its SHA-256 against trainer_state.json.
func VerifyCheckpoint(dir string) (State, error) { return verifyCheckpoint(dir, true, nil) }

// VerifyWeights is VerifyCheckpoint of what sampling from the checkpoint
// reads: every file but the optimizer's, which need not be there (a copy
// for generating text has no use for it).
func VerifyWeights(dir string) (State, error) { return verifyCheckpoint(dir, false, nil) }

// VerifyHashed is VerifyCheckpoint (VerifyWeights where !withOptimizer)
// for files whose SHA-256 (hex) the caller took as it wrote them (a
// download hashes what it receives): those are not read again, the others
// are.
func VerifyHashed(dir string, withOptimizer bool, sums map[string]string) (State, error) {
	return verifyCheckpoint(dir, withOptimizer, sums)
}

func verifyCheckpoint(dir string, withOptimizer bool, sums map[string]string) (State, error) {
	st, err := checkCheckpoint(dir, withOptimizer)
	if err != nil {
		return st, err
	}
	for name, sum := range st.Files {
		if name == OptimizerFile && !withOptimizer {
			continue
		}
		if got, ok := sums[name]; ok {
			if err := matchSum(dir, name, got, sum); err != nil {
				return st, err
			}
			continue
		}
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return st, notRead(dir, err, "checkpoint %s is incomplete: %w; use an earlier one", dir, err)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			return st, damaged("checkpoint %s: read %s: %w", dir, name, err)
		}
		if err := matchSum(dir, name, hex.EncodeToString(h.Sum(nil)), sum); err != nil {
			return st, err
		}
	}
	return st, nil
}

func matchSum(dir, name, got string, want FileSum) error {
	if got != want.SHA256 {
		return damaged("checkpoint %s: %s has SHA-256 %s, %s says %s (corrupted): use an earlier checkpoint", dir, name, got, StateFile, want.SHA256)
	}
	return nil
}

// DirStep is the step a checkpoint directory's name says (step-NNNNNNN),
// on disk or in object storage.
func DirStep(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, stepDirPrefix)
	if !ok {
		return 0, false
	}
	step, err := strconv.Atoi(rest)
	return step, err == nil && step >= 0
}

// StepDirs lists root's step directories (a run's checkpoints, as
// training writes them), newest first; none where root does not exist.
func StepDirs(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("find checkpoint: %w", err)
	}
	type cand struct {
		step int
		dir  string
	}
	var cands []cand
	for _, e := range entries {
		step, ok := DirStep(e.Name())
		if !e.IsDir() || !ok {
			continue
		}
		cands = append(cands, cand{step, filepath.Join(root, e.Name())})
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].step > cands[j].step })
	dirs := make([]string, len(cands))
	for i, c := range cands {
		dirs[i] = c.dir
	}
	return dirs, nil
}

// LatestIntactCheckpoint returns the directory and state of the highest
// step under root that passes VerifyCheckpoint, or ErrNoCheckpoint. Each
// newer one found damaged is set aside (SetAside) with a warning that names
// it and what is wrong; any other error (a format this build does not
// read) is returned as is.
func LatestIntactCheckpoint(root string, log *zap.Logger) (string, State, error) {
	var st State
	dir, err := newestUsable(root, log, func(dir string) (err error) {
		st, err = VerifyCheckpoint(dir)
		return err
	})
	return dir, st, err
}

// newestUsable walks root's step directories newest first and returns the
// first that use accepts. A directory use finds damaged is set aside and
// the walk goes on; any other error ends it.
func newestUsable(root string, log *zap.Logger, use func(dir string) error) (string, error) {
	dirs, err := StepDirs(root)
	if err != nil {
		return "", err
	}
	var setAside []string
	for _, d := range dirs {
		err := use(d)
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, ErrDamaged) {
			return "", err
		}
		aside, aerr := SetAside(d)
		if aerr != nil {
			return "", fmt.Errorf("%w; setting it aside failed too (%v): move it out of %s by hand", err, aerr, root)
		}
		setAside = append(setAside, aside)
		log.Warn("damaged checkpoint set aside; the resume takes the next whole one (the same step from object storage where a worker holds it there whole, else an earlier one)",
			zap.String("checkpoint", d), zap.String("now", aside), zap.Error(err))
	}
	if len(setAside) > 0 {
		return "", AllDamagedError{Root: root, SetAside: setAside}
	}
	return "", ErrNoCheckpoint
}

// AllDamagedError says that root held checkpoints and every one was found
// damaged and set aside: there is nothing to resume from, which is not
// the same as a run that has not started (errors.Is ErrNoCheckpoint holds
// for both). A resume that silently started over would train the steps
// again and overwrite the run's metrics.
type AllDamagedError struct {
	Root     string
	SetAside []string // the damaged directories' new names, newest first
}

func (e AllDamagedError) Error() string {
	return fmt.Sprintf("every checkpoint in %s is damaged (%d set aside, the newest now %s): nothing to resume from",
		e.Root, len(e.SetAside), filepath.Base(e.SetAside[0]))
}

func (e AllDamagedError) Is(target error) bool { return target == ErrNoCheckpoint }

// SetAside renames a damaged checkpoint directory to <dir>.damaged (or
// <dir>.damaged-N when that exists), where no resume looks for it and its
// files stay for inspection, and returns the new name.
func SetAside(dir string) (string, error) {
	for n := 1; n < 1000; n++ {
		to := dir + ".damaged"
		if n > 1 {
			to += "-" + strconv.Itoa(n)
		}
		if _, err := os.Lstat(to); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := os.Rename(dir, to); err != nil {
			return "", err
		}
		return to, SyncDir(filepath.Dir(dir))
	}
	return "", fmt.Errorf("%s.damaged and .damaged-2 to -999 all exist: remove some", dir)
}

// ReadCheckpoint loads dir, verifying every file against the hashes in
// trainer_state.json. When want is not nil, a checkpoint of another shape
// is refused with an error that names both shapes.
func ReadCheckpoint(dir string, want *model.Config) (*Snapshot, error) {
	st, err := CheckCheckpoint(dir)
	if err != nil {
		return nil, badInput(err)
	}
	files := map[string][]byte{}
	for name, sum := range st.Files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, notRead(dir, err, "read checkpoint %s: %w", dir, err)
		}
		got := sha256.Sum256(b)
		if err := matchSum(dir, name, hex.EncodeToString(got[:]), sum); err != nil {
			return nil, badInput(err)
		}
		files[name] = b
	}
	c, err := model.ParseConfig(files[ConfigFile])
	if err != nil {
		return nil, badInput(fmt.Errorf("checkpoint %s: %s: %w", dir, ConfigFile, err))
	}
	if want != nil {
		if err := sameShape(c, *want); err != nil {
			return nil, badInput(fmt.Errorf("checkpoint %s: %w: %s", dir, err, otherModelFix))
		}
	}
	s := &Snapshot{Config: c, State: st, Tokenizer: files[TokenizerFile]}
	path := filepath.Join(dir, ModelFile)
	mf, err := model.DecodeSafetensors(path, files[ModelFile])
	if err != nil {
		return nil, err
	}
	if s.Params, err = model.ParamsFromFile(path, mf, c); err != nil {
		return nil, err
	}
	path = filepath.Join(dir, OptimizerFile)
	of, err := model.DecodeSafetensors(path, files[OptimizerFile])
	if err != nil {
		return nil, err
	}
	if s.Optimizer, err = readOptimizer(path, of, s.Params); err != nil {
		return nil, err
	}
	return s, nil
}

// checkTokenizer refuses to go on from the checkpoint whose
// trainer_state.json, read from dir, is st with tok, a tokenizer other than
// the one it was trained with (told apart by their tokenizer.json's
// SHA-256: the one st lists for its copy, which a read of the checkpoint
// checks). An id means the text its tokenizer gives it: under another
// tokenizer of the same vocabulary size every shape still matches, the run
// would train on teaching the weights other meanings for their ids, and
// its next checkpoint would carry the other tokenizer.json, hiding the
// change. Nothing is compared when the checkpoint holds no tokenizer.json
// or the run gives none: there is no second tokenizer to compare with.
func checkTokenizer(dir string, st State, tok tokens.Tokenizer) error {
	had, ok := st.Files[TokenizerFile]
	if !ok || had.Size == 0 || tok.SHA256 == "" || strings.EqualFold(had.SHA256, tok.SHA256) {
		return nil
	}
	return badInput(fmt.Errorf("checkpoint %s (step %d) was trained with tokenizer %s, but this run gives tokenizer %s: "+
		"their ids mean different text, which the model's shape does not show; "+
		"resume with the tokenizer the run was trained with (the checkpoint's %s is a copy of it), "+
		"or train with the new one as a new run, under another run name or --out directory",
		dir, st.Step, tokenizerLabel(st.TokenizerName, had.SHA256), tokenizerLabel(tok.Name, tok.SHA256), TokenizerFile))
}

// tokenizerOf is the tokenizer a run gives as checkTokenizer compares it:
// name, and the SHA-256 of b, its tokenizer.json (none where b is empty).
func tokenizerOf(name string, b []byte) tokens.Tokenizer {
	t := tokens.Tokenizer{Name: name}
	if len(b) > 0 {
		sum := sha256.Sum256(b)
		t.SHA256 = hex.EncodeToString(sum[:])
	}
	return t
}

// tokenizerLabel names a tokenizer in a message by its name, where known,
// and the first 12 hex digits of its tokenizer.json's SHA-256 (sum, in
// hex), the prefix that tells two tokenizers of one name apart.
func tokenizerLabel(name, sum string) string {
	short := strings.ToLower(sum[:min(len(sum), 12)])
	if name == "" {
		return "(unnamed, sha256 " + short + ")"
	}
	return name + " (sha256 " + short + ")"
}

// readOptimizer is the inverse of optimizerFile.
func readOptimizer(path string, f *model.SafetensorsFile, p *model.Params) (*model.OptimizerState, error) {
	step, err := strconv.Atoi(f.Metadata["step"])
	if err != nil {
		return nil, badInput(fmt.Errorf("%s: no optimizer step in the metadata: use an earlier checkpoint", path))
	}
	o := &model.OptimizerState{Step: step, M: make([]float32, len(p.Data)), V: make([]float32, len(p.Data))}
	off := 0
	for _, s := range p.Specs() {
		n := s.Elements()
		for _, part := range []struct {
			suffix string
			dst    []float32
		}{{expAvg, o.M[off : off+n]}, {expAvgSq, o.V[off : off+n]}} {
			t := f.Tensor(s.Name + part.suffix)
			if t == nil || fmt.Sprint(t.Shape) != fmt.Sprint(s.Shape) {
				return nil, badInput(fmt.Errorf("%s: tensor %s is missing or not of shape %v: the file was not written for this model", path, s.Name+part.suffix, s.Shape))
			}
			v, err := t.Float32s()
			if err != nil {
				return nil, badInput(fmt.Errorf("%s: %w", path, err))
			}
			copy(part.dst, v)
		}
		off += n
	}
	return o, nil
}

// otherModelFix is what to do about a checkpoint of another model layout
// than the run's.
const otherModelFix = "give the run the model it was trained with, or train a run of another name (sched train: another --out)"

// sameShape compares the fields that fix the parameter layout.
func sameShape(got, want model.Config) error {
	if g, w := Shape(got), Shape(want); g != w {
		return fmt.Errorf("it holds a model of another layout, %s", ShapeDiff(g, w))
	}
	return nil
}

// ShapeDiff says how the layout of Shape a differs from b, the run's: the
// fields a gives otherwise, each with the run's beside it ("d_model 64
// (this run's: d_model 512)"), where the two lists were given whole, too
// long a line for a one-line view of a failure to reach its remedy.
// Shapes of another form (another build's) are given whole.
func ShapeDiff(a, b string) string {
	pa, pb := shapeFields(a), shapeFields(b)
	if len(pa) != len(pb) {
		return a + " (this run's: " + b + ")"
	}
	var d []string
	for i := range pa {
		if pa[i] != pb[i] {
			d = append(d, fmt.Sprintf("%s (this run's: %s)", pa[i], pb[i]))
		}
	}
	return strings.Join(d, ", ")
}

// shapeFields are Shape s's fields: its parts between ", " outside
// parentheses ("d_ff 176 (4 experts, top 2)" is one).
func shapeFields(s string) []string {
	var out []string
	depth, from := 0, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '(':
			depth++
		case s[i] == ')':
			depth = max(depth-1, 0)
		case depth == 0 && strings.HasPrefix(s[i:], ", "):
			out = append(out, s[from:i])
			from = i + 2
		}
	}
	return append(out, s[from:])
}

// Shape says the fields of c that fix the parameter layout, which a
// checkpoint must share with the run that resumes it; two configurations
// of one layout say the same.
func Shape(c model.Config) string {
	ff := "dense"
	if c.Experts > 0 {
		ff = fmt.Sprintf("%d experts, top %d", c.Experts, c.ExpertsPerTok)
	}
	return fmt.Sprintf("vocab %d, d_model %d, %d layers, %d heads, %d KV heads, head_dim %d, d_ff %d (%s), tied %v",
		c.VocabSize, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.Intermediate, ff, c.TieEmbeddings)
}
