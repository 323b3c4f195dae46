package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest/hub"
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
		matches, err := filepath.Glob(p.Glob)
		if err != nil {
			return out, &PresetError{fmt.Errorf("dataset %s: %w", p.Name, err)}
		}
		for _, m := range matches {
			st, err := os.Stat(m)
			if err != nil || !st.Mode().IsRegular() {
				continue
			}
			out.Files = append(out.Files, hub.File{Path: m, Type: "file", Size: st.Size()})
		}
		if len(out.Files) == 0 {
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
		for _, root := range p.ListRoots() {
			files, err := hc.List(ctx, p.Repo, rev, root)
			var nf *hub.NotFoundError
			if errors.As(err, &nf) {
				continue // a var value with no directory: checked by `datasets check`
			}
			if err != nil {
				return out, err
			}
			for _, f := range files {
				if p.Match(f.Path) && !seen[f.Path] {
					seen[f.Path] = true
					out.Files = append(out.Files, f)
				}
			}
		}
		if len(out.Files) == 0 {
			return out, &PresetError{fmt.Errorf("dataset %s (%s at %s) has no files matching %v: check the preset's include patterns and vars", p.Name, p.Repo, rev, p.Patterns())}
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
	StoreDir      string // the token store
	DataDir       string // downloads and shard files, deleted as they are used
	Seed          uint64
	MaxFiles      int   // 0: all
	MaxTokens     int64 // the store stops below this many tokens (0: no limit)
	MaxDisk       int64 // tokens.bin plus one shard file stay below this (0: no limit)
	Logger        *zap.Logger
}

// Report is what an ingest did.
type Report struct {
	Revision   string
	Files      int
	Appended   int
	Duplicates int
	Tokens     int64 // appended by this run
	// SkippedFiles counts whole files left out, by reason; SkippedRecords
	// the documents left out of appended files.
	SkippedFiles   Skips
	SkippedRecords Skips
	// Stopped says why the run ended before the last file, if it did.
	Stopped string
}

// Direct runs the whole pipeline in one process: plan, then for each file
// download, tokenize into a shard file, append it exactly once, and delete
// the raw and shard files. A re-run appends only what is missing.
func Direct(ctx context.Context, opt DirectOptions) (Report, error) {
	log := opt.Logger
	if log == nil {
		log = zap.NewNop()
	}
	rep := Report{SkippedFiles: Skips{}, SkippedRecords: Skips{}}
	plan, err := Plan(ctx, opt.Preset, opt.Hub, opt.Seed)
	if err != nil {
		return rep, err
	}
	rep.Revision = plan.Revision
	if opt.MaxFiles > 0 && len(plan.Files) > opt.MaxFiles {
		plan.Files = plan.Files[:opt.MaxFiles]
	}
	rep.Files = len(plan.Files)
	if err := os.MkdirAll(opt.DataDir, 0o755); err != nil {
		return rep, err
	}
	eos, ok := opt.Tokenizer.EOS()
	if !ok {
		return rep, errors.New("the tokenizer has no end-of-text token")
	}
	app, err := tokens.OpenAppender(ctx, opt.StoreDir, tokens.Tokenizer{
		Name: opt.TokenizerName, SHA256: opt.Tokenizer.SHA256(), VocabSize: opt.Tokenizer.VocabSize(), EOS: eos,
	}, log)
	if err != nil {
		return rep, err
	}
	defer app.Close()
	done := map[string]bool{}
	for _, s := range app.Manifest().Shards {
		done[s.ID] = true
	}
	for _, s := range app.Manifest().Skipped {
		done[s.ID] = true
	}
	for _, f := range plan.Files {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		id := ShardID(opt.Preset, f.Path)
		if opt.Preset.Glob != "" {
			// Hashed just before it is read, so that the id names the
			// content the store gets.
			if done[id] {
				rep.Duplicates++
				continue
			}
			size, sum, err := hashFile(ctx, f.Path)
			if err != nil {
				return rep, err
			}
			id = LocalShardID(size, sum)
		}
		if done[id] {
			rep.Duplicates++
			continue
		}
		done[id] = true
		res, err := ingestFile(ctx, opt, app, plan.Revision, f, id)
		if reason := SkipReason(err); reason != "" {
			log.Warn("file skipped", zap.String("file", f.Path), zap.String("reason", reason), zap.Error(err))
			rep.SkippedFiles.Add(reason, 1)
			if err := app.Skip(ctx, tokens.Skipped{ID: id, Source: f.Path, Revision: plan.Revision, Reason: reason + ": " + err.Error()}); err != nil {
				return rep, err
			}
			continue
		}
		var stop *stopError
		if errors.As(err, &stop) {
			rep.Stopped = stop.Error()
			return rep, nil
		}
		if err != nil {
			return rep, err
		}
		rep.SkippedRecords.Merge(res.skips)
		if res.duplicate {
			rep.Duplicates++
			continue
		}
		rep.Appended++
		rep.Tokens += res.tokens
		log.Info("shard appended", zap.String("file", f.Path), zap.Int64("tokens", res.tokens), zap.Int64("documents", res.documents))
	}
	return rep, nil
}

// RecordSkips records in the store the documents left out of the input
// named by base, one entry per reason with its count, in a stable order.
func RecordSkips(ctx context.Context, app *tokens.Appender, base tokens.Skipped, skips Skips) error {
	for _, reason := range slices.Sorted(maps.Keys(skips)) {
		s := base
		s.Reason, s.Count = reason, skips[reason]
		if err := app.Skip(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// stopError ends an ingest cleanly at a limit.
type stopError struct{ msg string }

func (e *stopError) Error() string { return e.msg }

type fileResult struct {
	tokens, documents int64
	duplicate         bool
	skips             Skips
}

func ingestFile(ctx context.Context, opt DirectOptions, app *tokens.Appender, rev string, f hub.File, id string) (fileResult, error) {
	local := f.Path
	if opt.Hub != nil {
		dst, err := SafeJoin(filepath.Join(opt.DataDir, "raw"), f.Path)
		if err != nil {
			return fileResult{}, err
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fileResult{}, err
		}
		if err := opt.Hub.Download(ctx, opt.Preset.Repo, rev, f, dst); err != nil {
			return fileResult{}, err
		}
		defer os.Remove(dst)
		local = dst
	}
	src, err := Open(ctx, local, OpenOptions{Name: f.Path, Columns: opt.Preset.Columns, SWH: opt.SWH})
	if err != nil {
		return fileResult{}, err
	}
	defer src.Close()
	shard, err := os.CreateTemp(opt.DataDir, "shard-*.bin")
	if err != nil {
		return fileResult{}, err
	}
	defer os.Remove(shard.Name())
	defer shard.Close()
	st, err := WriteShard(ctx, src, opt.Tokenizer, shard)
	if err != nil {
		return fileResult{}, err
	}
	if st.Documents == 0 {
		return fileResult{}, &SkipError{Reason: SkipEmptyFile, Path: f.Path, Err: fmt.Errorf("no usable documents (skipped: %s)", st.Skips)}
	}
	m := app.Manifest()
	if opt.MaxTokens > 0 && m.Tokens+st.Tokens > opt.MaxTokens {
		return fileResult{}, &stopError{fmt.Sprintf("stopped before %s: the store holds %d tokens and this shard's %d would pass --max-tokens %d", f.Path, m.Tokens, st.Tokens, opt.MaxTokens)}
	}
	shardBytes := st.Tokens * int64(m.Dtype.Width())
	if opt.MaxDisk > 0 && m.Tokens*int64(m.Dtype.Width())+2*shardBytes > opt.MaxDisk {
		// Twice the shard: the shard file and its copy in tokens.bin coexist.
		return fileResult{}, &stopError{fmt.Sprintf("stopped before %s: appending its %d bytes would pass --max-disk %d", f.Path, shardBytes, opt.MaxDisk)}
	}
	if _, err := shard.Seek(0, io.SeekStart); err != nil {
		return fileResult{}, err
	}
	res, err := app.Append(ctx, tokens.ShardInfo{ID: id, Source: f.Path, Revision: rev, SHA256: st.SHA256}, shard)
	if err != nil {
		return fileResult{}, fmt.Errorf("appending %s: %w", f.Path, err)
	}
	if err := RecordSkips(ctx, app, tokens.Skipped{ID: id, Source: f.Path, Revision: rev}, st.Skips); err != nil {
		return fileResult{}, err
	}
	return fileResult{tokens: st.Tokens, documents: st.Documents, duplicate: res.Duplicate, skips: st.Skips}, nil
}
