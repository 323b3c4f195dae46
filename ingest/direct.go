package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/bmatcuk/doublestar/v4"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// Planned is a dataset's file list at a resolved revision, in ingest order.
type Planned struct {
	Revision string
	Files    []hub.File
}

// Plan lists the preset's files (from the hub, or the local glob) and orders
// them by a seeded hash of their paths: a prefix of the order samples the
// whole dataset rather than its first directory, and the same seed gives the
// same order, so a re-run plans the same shards.
func Plan(ctx context.Context, p Preset, hc *hub.Client, seed uint64) (Planned, error) {
	var out Planned
	if p.Glob != "" {
		files, passed, err := localFiles(p.Glob)
		if err != nil {
			return out, &PresetError{fmt.Errorf("dataset %s: %w", p.Name, err)}
		}
		out.Files = files
		if len(out.Files) == 0 {
			if st, err := os.Stat(p.Glob); err == nil && st.IsDir() {
				return out, &PresetError{fmt.Errorf("dataset %s: %s is a directory: name its files with a glob, such as %s%s", p.Name, p.Glob, LocalPrefix, filepath.Join(p.Glob, "*"))}
			}
			if len(passed) > 0 {
				more := ""
				if len(passed) > 1 {
					more = fmt.Sprintf(", and %d more that are not regular files", len(passed)-1)
				}
				return out, &PresetError{fmt.Errorf("dataset %s: %q matches no regular file (%s%s): only regular files are read, so give a glob that matches files of text, JSON lines or Parquet",
					p.Name, p.Glob, passed[0], more)}
			}
			return out, &PresetError{fmt.Errorf("dataset %s: no files match %q", p.Name, p.Glob)}
		}
		out.Revision = "local"
	} else {
		if hc == nil {
			return out, errors.New("a hub dataset needs a hub client")
		}
		rev, err := hc.ResolveRevision(ctx, p.Repo, p.Revision)
		if err != nil {
			return out, err
		}
		out.Revision = rev
		seen := map[string]bool{}
		pats := p.expand()
		hits := make([]int, len(pats))
		for _, root := range p.ListRoots() {
			files, err := hc.List(ctx, p.Repo, rev, root)
			var nf *hub.NotFoundError
			if errors.As(err, &nf) {
				continue // a var value with no directory: said below
			}
			if err != nil {
				return out, err
			}
			for _, f := range files {
				matched := false
				for i, pat := range pats {
					if ok, _ := path.Match(pat.pattern, f.Path); ok {
						hits[i]++
						matched = true
					}
				}
				if matched && !seen[f.Path] {
					seen[f.Path] = true
					out.Files = append(out.Files, f)
				}
			}
		}
		// A value that matches nothing is most often misspelt
		// (language=Golang for Go): the plan would read the other values
		// alone, and the store lack that part for good without a word.
		miss, missed := unmatchedValues(pats, hits)
		tree := hc.DatasetPage(p.Repo) + "/tree/" + rev
		switch {
		case len(out.Files) == 0 && len(miss) > 0:
			return out, &PresetError{fmt.Errorf("dataset %s (%s at %s): %s matched no file (%s): check the spelling against %s, or give another value with --set",
				p.Name, p.Repo, rev, strings.Join(miss, ", "), strings.Join(missed, ", "), tree)}
		case len(out.Files) == 0:
			return out, &PresetError{fmt.Errorf("dataset %s (%s at %s) has no files matching %v: check the preset's include patterns and vars", p.Name, p.Repo, rev, p.Patterns())}
		case len(miss) > 0:
			return out, &PresetError{fmt.Errorf("dataset %s (%s at %s): %s matched no file (%s; the other values match %d): check the spelling against %s, or leave the value out of --set",
				p.Name, p.Repo, rev, strings.Join(miss, ", "), strings.Join(missed, ", "), len(out.Files), tree)}
		}
	}
	key := func(path string) uint64 {
		h := fnv.New64a()
		h.Write([]byte(strconv.FormatUint(seed, 10) + "\x00" + path))
		return h.Sum64()
	}
	slices.SortFunc(out.Files, func(a, b hub.File) int {
		ka, kb := key(a.Path), key(b.Path)
		switch {
		case ka < kb:
			return -1
		case ka > kb:
			return 1
		}
		return 0
	})
	return out, nil
}

// localFiles lists the regular files glob matches, and the matches it
// passes over that are not regular files or cannot be read (a device, a
// FIFO, a socket, or a link to one or to nothing): reading a device or a
// FIFO would never end, or hang. A directory it matches is neither: a glob
// such as src/* matches them beside the files, and they hold no text.
// "**" matches any number of directories, as in .gitignore; a link to a
// directory is not followed there (a loop would never end), and every file
// is held to the local roots after.
func localFiles(glob string) (files []hub.File, passed []NotRegular, err error) {
	matches, err := doublestar.FilepathGlob(glob, doublestar.WithNoFollow())
	if err != nil {
		return nil, nil, err
	}
	for _, m := range matches {
		st, err := os.Stat(m)
		switch {
		case err == nil && st.Mode().IsRegular():
			files = append(files, hub.File{Path: m, Type: "file", Size: st.Size()})
		case err == nil && st.IsDir():
			// Not a file, and no surprise: passed over unsaid.
		default:
			passed = append(passed, notRegular(m, st, err))
		}
	}
	return files, passed, nil
}

// NotRegular is a match of a local dataset's glob that is not a regular
// file, passed over unread: What it is, in words ("a FIFO").
type NotRegular struct {
	Path, What string
}

func (n NotRegular) String() string { return n.Path + " is " + n.What }

// notRegular says what path is, where its Stat gave st, or err: through
// a symbolic link, where the link leads, as a link out of the glob's
// directory is named.
func notRegular(path string, st fs.FileInfo, err error) NotRegular {
	what := "not a regular file"
	switch {
	case errors.Is(err, fs.ErrNotExist):
		what = "gone"
	case err != nil:
		what = fmt.Sprintf("unreadable (%v)", err)
	case st.Mode()&fs.ModeCharDevice != 0:
		what = "a character device"
	case st.Mode()&fs.ModeDevice != 0:
		what = "a block device"
	case st.Mode()&fs.ModeNamedPipe != 0:
		what = "a FIFO (named pipe)"
	case st.Mode()&fs.ModeSocket != 0:
		what = "a socket"
	}
	if l, lerr := os.Lstat(path); lerr == nil && l.Mode()&fs.ModeSymlink != 0 {
		target, terr := filepath.EvalSymlinks(path)
		if terr != nil {
			target, _ = os.Readlink(path)
		}
		if errors.Is(err, fs.ErrNotExist) {
			what = "which does not exist"
		}
		what = fmt.Sprintf("a symbolic link to %s, %s", target, what)
	}
	return NotRegular{Path: path, What: what}
}

// ShardID is the exactly-once key of a hub dataset's file in a store; a
// local file's is its content (LocalShardID).
func ShardID(p Preset, path string) string {
	if p.Repo != "" {
		return p.Repo + "/" + path
	}
	return p.Name + "/" + path
}

// DirectOptions configure Direct.
type DirectOptions struct {
	Preset    Preset
	Hub       *hub.Client // nil for local datasets
	SWH       *SWH        // for presets whose text is in Software Heritage
	Tokenizer *tokenizer.Tokenizer
	// TokenizerName is recorded in a new store's manifest.
	TokenizerName string
	// StoreDir is the token store; its last element is the store's name
	// in the pipeline's steps, so it must be a valid store name.
	StoreDir string
	// DataDir holds, in a directory of the run's own (.shards-*, removed
	// when Direct returns), the downloads, each deleted once tokenized, and
	// the shard token files waiting for their append. A run removes the
	// directories that killed runs left, never one a live run holds.
	DataDir string
	Seed    uint64
	// Revision is --revision, where the user gave one: the preset's
	// revision already holds it, and the plan's refusals name the flag.
	Revision  string
	MaxFiles  int   // 0: all
	MaxTokens int64 // the store stops below this many tokens (0: no limit)
	MaxDisk   int64 // the store's tokens.bin stays at most this size (0: no limit)
	// Progress, when set, is told the report so far after each file.
	Progress func(Report)
	Logger   *zap.Logger

	// onRead, set by tests, is the pipeline's (Pipeline.onRead).
	onRead func(stage readStage, path string)
}

// Report is what an ingest did.
type Report struct {
	Revision string
	Files    int
	// Appended counts the files appended whole, or whose rest went in
	// after a part of them an earlier run took.
	Appended int
	// Duplicates counts the files the store already held: appended, or
	// recorded as skipped by an earlier run (SkippedBefore of them),
	// which this run passed over unread.
	Duplicates int
	// Partial counts the files of which this run took a part (at its
	// limit): their rest waits for a run under a larger one.
	Partial int
	// Same counts files with the same content as another file of the
	// plan: one shard holds it.
	Same      int
	Documents int64 // appended by this run
	Tokens    int64 // appended by this run
	// SkippedFiles counts whole files this run left out, by reason;
	// SkippedRecords the documents left out of appended files.
	SkippedFiles   Skips
	SkippedRecords Skips
	// FirstSkipped says why the first file this run skipped was left out.
	FirstSkipped string
	// SkippedBefore counts, by the reason recorded, the files of
	// Duplicates that the store holds as skipped whole: none of their
	// text is in it. FirstSkippedBefore says why the first was left out,
	// as the run that read it said.
	SkippedBefore      Skips
	FirstSkippedBefore string
	// NotRegular are the matches of a local dataset's glob passed over
	// unread for not being regular files (a device, a FIFO, a socket).
	NotRegular []NotRegular
	// Stopped says why the run ended before the last file, if it did.
	Stopped string
}

// StoppedBeforePlan reports whether the run stopped before it listed a
// file: the store was at its limit, or full at it, from the start.
func (r Report) StoppedBeforePlan() bool { return r.Stopped != "" && r.Revision == "" }

// Direct runs an ingest in this process through the queue's own steps:
// Pipeline.Plan, then Pipeline.Shard for each planned file (a few files at
// once, sharing the process's encoders), then Pipeline.Append in the plan's
// order, so that a seed and a limit give the store the same documents as
// they would through the queue. Shard files go through a directory store
// under DataDir. A re-run appends only what is missing; a limit ends the
// run cleanly with Report.Stopped set, once the store holds the documents
// of the file at hand that fit (a re-run under a larger limit takes that
// file's rest first).
func Direct(ctx context.Context, opt DirectOptions) (rep Report, err error) {
	rep = Report{SkippedFiles: Skips{}, SkippedRecords: Skips{}, SkippedBefore: Skips{}}
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	dir, err := filepath.Abs(opt.StoreDir)
	if err != nil {
		return rep, fmt.Errorf("ingest: token store %s: %w", opt.StoreDir, err)
	}
	storeName := filepath.Base(dir)
	if err := CheckStoreName(storeName); err != nil {
		return rep, &PresetError{fmt.Errorf("token store directory %s: its last element names the store: %w", opt.StoreDir, errors.Unwrap(err))}
	}
	eos, ok := opt.Tokenizer.EOS()
	if !ok {
		return rep, &PresetError{errors.New("the tokenizer has no end-of-text token, which separates documents in a token store")}
	}
	if err := os.MkdirAll(opt.DataDir, 0o755); err != nil {
		return rep, fmt.Errorf("ingest: %w", err)
	}
	// A killed run (SIGKILL, the OOM killer) leaves its directory behind:
	// this run removes those no live run holds.
	stale, err := RemoveStaleTemp(opt.DataDir, shardsPattern)
	for _, s := range stale {
		log.Info("removed the temporary directory of a killed ingest", zap.String("dir", s))
	}
	if err != nil {
		return rep, fmt.Errorf("ingest: %w", err)
	}
	tmp, err := MkdirTemp(opt.DataDir, shardsPattern)
	if err != nil {
		return rep, fmt.Errorf("ingest: %w", err)
	}
	defer func() {
		// Left unheld, the directory is the next run's to remove, which
		// fails with the error: this run's outcome stands.
		if err := tmp.Remove(); err != nil {
			log.Warn("temporary directory not removed; the next direct ingest removes it", zap.String("dir", tmp.Path), zap.Error(err))
		}
	}()
	objects, err := store.NewLocal(filepath.Join(tmp.Path, "objects"))
	if err != nil {
		return rep, err
	}
	// Downloads go in the held directory too (DataDir/raw under it), so a
	// killed run's are removed with its shards. A shard that fills the
	// disk says how much of it had been written (countedPuts).
	p := &Pipeline{Objects: countedPuts{objects}, Hub: opt.Hub, SWH: opt.SWH, Presets: map[string]Preset{opt.Preset.Name: opt.Preset},
		Tokenizer: func(context.Context, string) (*tokenizer.Tokenizer, error) { return opt.Tokenizer, nil },
		DataDir:   tmp.Path, StoresDir: filepath.Dir(dir), Logger: log, onRead: opt.onRead}
	if opt.Preset.Glob != "" {
		p.LocalRoots = []string{globRoot(opt.Preset.Glob)}
	}
	closeStores := p.holdStores()
	defer func() {
		if cerr := closeStores(); err == nil {
			err = cerr
		}
	}()
	// The plan skips what the status lists; here the store itself says
	// what it holds, and the mark beside it where an append left out a
	// document (the queue keeps that in the store's status object).
	// earlier are the files it records as skipped whole, which the plan
	// counts as done with the files appended: the plan sees a status
	// without them (whole is the status with them), so that its shards
	// name them, and the run passes over them, counting them apart
	// (Report.SkippedBefore).
	var earlier map[string]tokens.Skipped
	var whole StoreStatus
	if m, err := tokens.ReadManifest(dir); err == nil {
		// A store of this tokenizer is taken now, before anything is read
		// for it: a run on a store another process appends to stops here,
		// not after downloading and tokenizing its first files, and leaves
		// that process's store directory alone. Another tokenizer's store
		// is the plan's to refuse.
		tok := tokens.Tokenizer{Name: opt.TokenizerName, SHA256: opt.Tokenizer.SHA256(), VocabSize: opt.Tokenizer.VocabSize(), EOS: eos}
		if tokens.CheckWrittenWith(storeName, m.Tokenizer, tok) == nil {
			app, _, err := p.appender(ctx, dir, tok)
			if err != nil {
				return rep, err
			}
			held := app.Manifest()
			m = &held
		}
		if _, err := p.publishStatus(ctx, storeName, *m, Limits{}, Limits{}); err != nil {
			return rep, err
		}
		p.statusesMu.Lock()
		st := p.statuses[storeName]
		st.Full = readFullMark(dir, log)
		whole, earlier = st, heldSkips(*m)
		st.Done = slices.DeleteFunc(slices.Clone(st.Done), func(id string) bool { _, ok := earlier[id]; return ok })
		p.statuses[storeName] = st
		p.statusesMu.Unlock()
	}
	defer func() {
		if werr := p.keepFullMark(ctx, dir, storeName); err == nil {
			err = werr
		}
	}()
	limits := Limits{MaxTokens: opt.MaxTokens, MaxDisk: opt.MaxDisk}
	plan, err := p.Plan(ctx, PlanJob{Dataset: opt.Preset.Name, Preset: Carried(opt.Preset), Store: storeName, Tokenizer: opt.TokenizerName, Seed: opt.Seed, MaxFiles: opt.MaxFiles, Limits: limits, Revision: opt.Revision})
	if earlier != nil {
		p.statusesMu.Lock()
		p.statuses[storeName] = whole
		p.statusesMu.Unlock()
	}
	var stop *StopError
	var outside *OutsideRootsError
	switch {
	case errors.As(err, &stop):
		rep.Stopped = stop.Msg
		return rep, nil
	case errors.As(err, &outside):
		return rep, &PresetError{fmt.Errorf("local file %s leads outside %s, the directory its glob names: put the directory it links to in the glob", outside.Path, p.LocalRoots[0])}
	case err != nil:
		return rep, err
	}
	rep.Revision, rep.Files, rep.Duplicates, rep.Same = plan.Revision, plan.Files, plan.Done, plan.Same
	if opt.Preset.Glob != "" {
		// The plan lists the regular files alone: what else the glob
		// matches is listed again here, for the report.
		if _, passed, err := localFiles(opt.Preset.Glob); err == nil {
			rep.NotRegular = passed
		}
		for _, n := range rep.NotRegular {
			log.Warn("file passed over: only regular files are read", zap.String("file", n.Path), zap.String("is", n.What))
		}
	}
	plan.Shards = slices.DeleteFunc(plan.Shards, func(sj ShardJob) bool {
		s, ok := earlier[sj.ShardID]
		if !ok && opt.Preset.Glob != "" {
			s, ok = earlier[legacyShardID(opt.Preset, sj.Path)]
		}
		if !ok {
			return false
		}
		reason, why, cut := strings.Cut(s.Reason, ": ")
		if !cut {
			why = s.Reason
		}
		rep.Duplicates++
		rep.SkippedBefore.Add(reason, 1)
		if rep.FirstSkippedBefore == "" {
			rep.FirstSkippedBefore = why
		}
		log.Info("file passed over: the token store records it as skipped by an earlier run", zap.String("file", sj.Path), zap.String("reason", reason), zap.String("why", why))
		return true
	})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := shardAll(ctx, p, plan.Shards)
	defer func() {
		cancel()
		results.wait()
	}()
	for i := range plan.Shards {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		r, err := results.next(ctx, i)
		if err == nil {
			err = r.err
		}
		switch {
		case errors.As(err, &stop):
			rep.Stopped = stop.Msg
			return rep, nil
		case err != nil:
			return rep, err
		case r.done:
			rep.Duplicates++
			continue
		}
		res, err := p.Append(ctx, r.job, nil)
		results.release()
		if res.Part {
			rep.Partial++
			rep.Tokens += res.Tokens
			rep.Documents += res.Documents
			log.Info("part of a shard appended", zap.String("file", r.job.Source), zap.Int64("tokens", res.Tokens), zap.Int64("documents", res.Documents))
		}
		switch {
		case errors.As(err, &stop):
			rep.Stopped = stop.Msg
			if opt.Progress != nil && res.Part {
				opt.Progress(rep)
			}
			return rep, nil
		case err != nil:
			return rep, fmt.Errorf("appending %s: %w", r.job.Source, err)
		case res.Skipped:
			rep.SkippedFiles.Add(r.job.SkipReason, 1)
			if rep.FirstSkipped == "" {
				rep.FirstSkipped = r.job.SkipMessage
			}
		case res.Duplicate:
			rep.Duplicates++
		case res.Part:
			// Counted above: the part of a file whose shard stopped short
			// of it, all in, with room left; a later run reads its rest.
		default:
			rep.Appended++
			rep.Tokens += res.Tokens
			rep.Documents += res.Documents
			rep.SkippedRecords.Merge(r.job.Skipped)
			log.Info("shard appended", zap.String("file", r.job.Source), zap.Int64("tokens", res.Tokens), zap.Int64("documents", res.Documents))
		}
		if opt.Progress != nil {
			opt.Progress(rep)
		}
	}
	return rep, nil
}

// heldSkips are the records of the files m holds as skipped whole
// (SkipHeld), by id: not those it also holds appended.
func heldSkips(m tokens.Manifest) map[string]tokens.Skipped {
	out := map[string]tokens.Skipped{}
	for _, s := range m.Skipped {
		if SkipHeld(s) {
			out[s.ID] = s
		}
	}
	for _, sh := range m.Shards {
		delete(out, sh.ID)
	}
	return out
}

// shardsPattern names a direct ingest's directory under DataDir.
const shardsPattern = ".shards-*"

// FullMarkFile, in a token store's directory, is where a direct ingest
// keeps its store's StoreStatus.Full between runs, as {"full_at":{...}}:
// the limits at which an append left out a document that would pass them.
// A run again at such a limit then stops before it reads a file, as the
// queue's steps do, rather than downloading and tokenizing files that its
// first append would refuse.
//
// An older kiln kept the limits bare in this file ({"max_tokens":L})
// where an append refused a whole file, with room left for some of its
// documents: such a mark reads as none, so the same run after an upgrade
// fills the store to its limit, and replaces the mark, or removes it, as
// it ends. A bare mark that a later build wrote with today's meaning
// reads so too: that costs one run's first files, tokenized and refused,
// once.
const FullMarkFile = "ingest-full.json"

// fullMark is what FullMarkFile holds.
type fullMark struct {
	FullAt Limits `json:"full_at"`
}

// readFullMark returns the limits the mark in the store directory dir
// holds, or none. A mark that cannot be read is left out with a warning:
// it only saves work, and the next append that leaves out a document
// makes it again.
func readFullMark(dir string, log *zap.Logger) Limits {
	var mark fullMark
	b, err := os.ReadFile(filepath.Join(dir, FullMarkFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Limits{}
	}
	if err == nil {
		err = json.Unmarshal(b, &mark)
	}
	if err != nil || mark.FullAt.MaxTokens < 0 || mark.FullAt.MaxDisk < 0 {
		log.Warn("the token store's mark of where it is full is left out; the run finds the limit at its first append instead",
			zap.String("file", filepath.Join(dir, FullMarkFile)), zap.Error(err))
		return Limits{}
	}
	return mark.FullAt
}

// keepFullMark writes the Full of the store's status to its mark, or
// removes the mark when the store is not full (an append came under a
// larger limit, or none).
func (p *Pipeline) keepFullMark(ctx context.Context, dir, storeName string) error {
	st, err := p.Status(ctx, storeName)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil // no store was made
	}
	path := filepath.Join(dir, FullMarkFile)
	if st.Full == (Limits{}) {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("ingest: token store %s: %w", dir, err)
		}
		return nil
	}
	b, err := json.Marshal(fullMark{FullAt: st.Full})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, FullMarkFile+".tmp*")
	if err != nil {
		return fmt.Errorf("ingest: token store %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("ingest: token store %s: %w", dir, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("ingest: token store %s: %w", dir, err)
	}
	return os.Rename(tmp.Name(), path)
}

// globRoot is the directory of glob above its first pattern character: a
// direct ingest reads what its own glob names and nothing a link inside
// it leads to elsewhere.
func globRoot(glob string) string {
	if i := strings.IndexAny(glob, `*?[{\`); i >= 0 {
		return filepath.Dir(glob[:i] + "x")
	}
	return glob
}

// sharded is one planned file after Pipeline.Shard.
type sharded struct {
	job  AppendJob
	done bool
	err  error
}

// shardRun shards the planned files a few at a time, in the plan's order,
// holding at most a window of them ahead of the append: a shard file
// waits on disk for its turn, and a slow append should not let the whole
// dataset pile up there.
type shardRun struct {
	out    []chan sharded
	window chan struct{}
	wg     sync.WaitGroup
}

func shardAll(ctx context.Context, p *Pipeline, jobs []ShardJob) *shardRun {
	n := DefaultTokenizing()
	r := &shardRun{out: make([]chan sharded, len(jobs)), window: make(chan struct{}, 2*n)}
	for i := range r.out {
		r.out[i] = make(chan sharded, 1)
	}
	next := make(chan int)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(next)
		for i := range jobs {
			select {
			case r.window <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range n {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for i := range next {
				job, done, err := p.Shard(ctx, jobs[i], nil)
				r.out[i] <- sharded{job: job, done: done, err: err}
			}
		}()
	}
	return r
}

// next waits for the i-th file's shard.
func (r *shardRun) next(ctx context.Context, i int) (sharded, error) {
	select {
	case s := <-r.out[i]:
		if s.err != nil || s.done {
			r.release()
		}
		return s, nil
	case <-ctx.Done():
		return sharded{}, ctx.Err()
	}
}

// release frees the window place of a file whose shard is settled.
func (r *shardRun) release() { <-r.window }

// wait returns once no shard is being written; the caller has cancelled
// the context or consumed every shard.
func (r *shardRun) wait() { r.wg.Wait() }

// RecordSkips records in the store the documents left out of the input
// named by base, one entry per reason with its count, in a stable order.
// An append commits them with its shard (tokens.ShardInfo's Skipped); this
// records those of a shard a store holds without them.
func RecordSkips(ctx context.Context, app *tokens.Appender, base tokens.Skipped, skips Skips) error {
	for _, s := range skipRecords(base, skips) {
		if err := app.Skip(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// skipRecords are the store's records of the documents left out of the
// input named by base: one per reason with its count, in a stable order.
func skipRecords(base tokens.Skipped, skips Skips) []tokens.Skipped {
	var out []tokens.Skipped
	for _, reason := range slices.Sorted(maps.Keys(skips)) {
		if skips[reason] == 0 {
			continue
		}
		s := base
		s.Reason, s.Count = reason, skips[reason]
		out = append(out, s)
	}
	return out
}
