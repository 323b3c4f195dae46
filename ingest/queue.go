package ingest

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
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"

	"github.com/kiln-lm/kiln/ingest/hub"
	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// Pipeline runs the three queue steps of an ingest on whatever machine
// holds the task: Plan and Shard on any CPU worker, Append on the one
// machine that holds the token stores. The steps meet only in object
// storage (shard token files and each store's status) and in the tasks the
// caller enqueues from their results, so no step needs another's disk.
type Pipeline struct {
	// Objects holds the shard token files, tokens/<store>/shards/, and each
	// store's status, tokens/<store>/status.json (required).
	Objects store.Store
	// Hub downloads the files of hub datasets; nil on a worker that reads
	// only local datasets.
	Hub *hub.Client
	// SWH fetches the text of datasets that ship Software Heritage ids.
	SWH *SWH
	// Presets resolves a plan's dataset name (default: Presets("")).
	Presets map[string]Preset
	// Tokenizer finds a tokenizer by name (the tokenizer catalog); Shard
	// needs it.
	Tokenizer func(ctx context.Context, name string) (*tokenizer.Tokenizer, error)
	// DataDir is this machine's own scratch directory: downloads go to
	// DataDir/raw, each deleted once tokenized, and so do the copies that
	// local files are tokenized from (localcopy.go). Shard tokens go
	// straight to Objects as they are made.
	DataDir string
	// StoresDir holds the token stores, one directory per store; Append
	// needs it.
	StoresDir string
	// DecodeAhead is the text a parquet file's decoders may hold ahead of
	// its tokenization (0: ingest.DefaultDecodeAhead()).
	DecodeAhead int64
	// Tokenizing bounds the shards that read and tokenize at once on this
	// machine (nil: no bound); a worker sets it to DefaultTokenizing(). A
	// shard takes its place after the download and gives it back as soon as
	// its last token is written, before the object's upload completes, so
	// that a worker serving more shards than this keeps the cores busy
	// while a shard waits for its upload's tail: with two shards at once
	// and no bound, each sat 57 ms of its 190 ms in that wait on 16 cores,
	// together, and a third of the cores idled (docs/benchmarks/ingest.md).
	Tokenizing *semaphore.Weighted
	// Prefetch is the largest shard, in bytes, that an append reads whole
	// before it takes the store, so that of two appends at once one reads
	// while the other commits (0: DefaultPrefetch; negative: every shard
	// streams into the store as it is read).
	Prefetch int64
	// LocalRoots are the directories whose files this machine's tasks may
	// read for a local dataset (local:<glob>); a path outside them, once
	// symbolic links are resolved, ends its task with an OutsideRootsError.
	// None: the worker reads no local files. A worker sets the data
	// directory unless KILN_LOCAL_ROOTS says otherwise.
	LocalRoots []string
	// Logger receives the steps' logs (default: none).
	Logger *zap.Logger
	// Lease is until when this worker may write what speaks for the
	// stores in StoresDir to object storage: their statuses, and the
	// deletion of a shard appended (lease.go). A worker that serves append
	// sets its claim's Until (worker.AppendClaim): once it has passed,
	// another disk's worker may serve append and have made the statuses
	// say what its own disk holds. Nil: no bound (Direct, tests, a worker
	// that does not serve append).
	Lease func() time.Time
	// StoreWait is how long an append waits for its store while another
	// process holds it: another worker of this data directory holds it
	// while it commits, a direct ingest for its whole run. After it the
	// append fails with the *tokens.LockedError, its Waited set. 0 (Direct,
	// tests): it fails at once. A worker sets DefaultStoreWait.
	StoreWait time.Duration
	// StoreWaiting, when set, hears with the append's context what it
	// waits for while it waits for its store.
	StoreWaiting func(ctx context.Context, msg string)

	// onRead, set by tests, is called with a local file's path at each
	// stage of its read for its shard: a test changes the file on the disk
	// there.
	onRead func(stage readStage, path string)
	// held keeps each store's appender open from one append to the next
	// (Direct, which appends a whole plan in one process) rather than
	// opening the store and reading its manifest for every shard, which
	// costs time in the store's size: on 1,639 Go files that reopening
	// took three times the CPU of the whole ingest. Nil: every append
	// opens and closes its store, so that no worker holds a store's lock
	// between tasks.
	held map[string]*tokens.Appender
	// statuses, while stores are held, are their statuses as this process
	// last made them: the one process that appends is also the only
	// reader, and publishing a status of every shard id after each append
	// (JSON and an fsync of the object) and reading it back before each
	// shard cost time in the store's size too.
	statuses map[string]StoreStatus
	// statusesMu is set while stores are held (a Pipeline is otherwise a
	// value its users copy): shards read statuses while an append sets one.
	statusesMu *sync.Mutex
}

// appender opens the token store in dir for an append; done closes it
// unless p holds its stores open.
func (p *Pipeline) appender(ctx context.Context, dir string, tok tokens.Tokenizer) (app *tokens.Appender, done func(), err error) {
	if app := p.held[dir]; app != nil {
		return app, func() {}, nil
	}
	wait := tokens.LockWait{For: p.StoreWait}
	if p.StoreWaiting != nil {
		wait.Waiting = func(pid int) {
			p.StoreWaiting(ctx, fmt.Sprintf("waiting for the lock of token store %s, held by %s: one process appends to a store at a time", filepath.Base(dir), tokens.LockHolder(pid)))
		}
	}
	if app, err = tokens.OpenAppenderWaiting(ctx, dir, tok, p.log(), wait); err != nil {
		return nil, nil, err
	}
	if p.held != nil {
		p.held[dir] = app
		return app, func() {}, nil
	}
	return app, func() { app.Close() }, nil
}

// DefaultStoreWait is how long a worker's append waits for a store another
// process holds (Pipeline.StoreWait). Another worker's append holds it for
// one commit, well within it; a direct ingest holds it for its whole run,
// and the worker then sets the append back to wait rather than keep its
// append slot.
const DefaultStoreWait = 2 * time.Minute

// holdsStores reports whether p keeps its stores open (holdStores: a
// direct ingest), and with them their statuses, which are then this
// process's alone and never published for other shards to read.
func (p *Pipeline) holdsStores() bool { return p.statusesMu != nil }

// holdStores makes p keep its stores open until the returned function
// closes them.
func (p *Pipeline) holdStores() (closeAll func() error) {
	p.held = map[string]*tokens.Appender{}
	p.statusesMu = new(sync.Mutex)
	p.statuses = map[string]StoreStatus{}
	return func() error {
		var errs []error
		for dir, app := range p.held {
			if err := app.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing token store %s: %w", dir, err))
			}
		}
		p.held = nil
		p.statuses, p.statusesMu = nil, nil
		return errors.Join(errs...)
	}
}

// manifest is the store's manifest as of now, or nil when it has none.
func (p *Pipeline) manifest(dir string) *tokens.Manifest {
	if app := p.held[dir]; app != nil {
		m := app.Manifest()
		return &m
	}
	m, err := tokens.ReadManifest(dir)
	if err != nil {
		return nil
	}
	return m
}

// Limits stop an ingest before its store passes them; zero means none.
// Every job of an ingest carries its plan's limits.
type Limits struct {
	MaxTokens int64 `json:"max_tokens,omitempty"` // committed tokens
	MaxDisk   int64 `json:"max_disk,omitempty"`   // bytes of committed tokens (tokens.bin)
}

// StopError ends a step at its ingest's limit (--max-tokens, --max-disk):
// the planned end of an ingest that sizes its store, not a failure. The
// store holds all that fits: an append that reached the limit took the
// leading documents of its file that fit and no more, and any other step
// appended nothing. Raising the limit and planning again continues with
// the rest of that file and the files not yet in. A worker completes the
// step's task.
type StopError struct {
	Msg string
	// Tokens are what the step appended before it stopped: the part of
	// its file that fit.
	Tokens int64
}

// stopHint ends every StopError's message: what to do for more tokens.
const stopHint = "; raise the limit and plan again to continue"

func (e *StopError) Error() string { return e.Msg }

// MissingShardError is an append whose shard object is gone although the
// store does not hold the shard: retrying the append cannot bring it back.
type MissingShardError struct{ Store, ShardID, Object string }

func (e *MissingShardError) Error() string {
	return fmt.Sprintf("shard %s of token store %s is not in the store and its token file %s is gone: run its ingest:shard task again (sched status lists it) or plan the ingest again",
		e.ShardID, e.Store, e.Object)
}

func (e *MissingShardError) BadInput() bool { return true }

// The three jobs of an ingest are also its tasks' payloads: the queue
// stores them as JSON and a worker hands the decoded value to the Pipeline
// as it is. A change to their JSON is a new payload version (scheduler's
// policy for the kind).
const (
	KindPlan   = "ingest:plan"
	KindShard  = "ingest:shard"
	KindAppend = "ingest:append"
)

// PlanJob is one ingest:plan: list a dataset's files and queue one ShardJob
// for each file the store does not hold yet.
type PlanJob struct {
	// Dataset is a preset name, a Hugging Face dataset id or local:<glob>.
	Dataset string `json:"dataset"`
	// Revision overrides the preset's (a branch, tag or commit); the plan
	// records the resolved commit in each shard.
	Revision string `json:"revision,omitempty"`
	// Vars sets the preset's variables ("language": ["Python", "Go"]).
	Vars map[string][]string `json:"vars,omitempty"`
	// Store names the token store to fill (default: Dataset's last element).
	Store string `json:"store,omitempty"`
	// Tokenizer names the tokenizer: tokenizers/<Tokenizer>/tokenizer.json.
	Tokenizer string `json:"tokenizer,omitempty"`
	// Seed orders the files; the same seed plans the same order.
	Seed     uint64 `json:"seed,omitempty"`
	MaxFiles int    `json:"max_files,omitempty"` // 0: all files
	// Preset is Dataset's preset as the command that queued the plan
	// resolved it (Carried), so that a dataset of the user's presets file
	// needs no copy of that file on the workers; nil for local:<glob>, and
	// in plans queued before plans carried it, whose Dataset the worker
	// looks up in its own presets.
	Preset *Preset `json:"preset,omitempty"`
	Limits
}

func (PlanJob) Kind() string { return KindPlan }

// ShardJob is one ingest:shard: download one file of a dataset, tokenize it
// and write a shard token file under tokens/<Store>/shards/.
type ShardJob struct {
	Dataset string `json:"dataset"`
	// Repo is the hub dataset; empty for a local file, which Path then
	// names on the worker's machine.
	Repo     string `json:"repo,omitempty"`
	Revision string `json:"revision,omitempty"`
	// Path is the file's path inside the dataset repository.
	Path string `json:"path"`
	// Size, SHA256 (LFS) and GitOID (small files) verify the download.
	Size      int64   `json:"size,omitempty"`
	SHA256    string  `json:"sha256,omitempty"`
	GitOID    string  `json:"git_oid,omitempty"`
	Columns   Columns `json:"columns"`
	Store     string  `json:"store"`
	Tokenizer string  `json:"tokenizer"`
	// ShardID is the file's exactly-once key in the store's manifest.
	ShardID string `json:"shard_id,omitempty"`
	// From is the file's first record to read: where the part of it that
	// the store holds ends (0: the whole file).
	From int64 `json:"from,omitempty"`
	// Pinned is the setting that asked the plan for Revision by its commit
	// id, not by a branch or tag that resolved to it: a plan made again
	// asks for the same commit, so a force-push that removes it is that
	// setting's to change. Empty where a branch or tag was asked for.
	Pinned string `json:"pinned,omitempty"`
	Limits
}

func (ShardJob) Kind() string { return KindShard }

// AppendJob is one ingest:append: a shard token file to append to the
// store on the append worker's machine, exactly once (the manifest records
// shard ids), or (with SkipReason set) a file to record as skipped.
type AppendJob struct {
	Store string `json:"store"`
	// ShardID identifies the shard in the manifest (stable across retries).
	ShardID string `json:"shard_id"`
	// Object is the shard token file's key; empty for a skipped file.
	Object  string `json:"object,omitempty"`
	Dataset string `json:"dataset,omitempty"`
	Source  string `json:"source,omitempty"`
	// Revision is the dataset commit the shard was read at.
	Revision  string `json:"revision,omitempty"`
	SHA256    string `json:"sha256,omitempty"`
	Documents int64  `json:"documents,omitempty"`
	Tokens    int64  `json:"tokens,omitempty"`
	// Tokenizer wrote the shard: a new store records it and an existing one
	// must match it.
	Tokenizer tokens.Tokenizer `json:"tokenizer"`
	// Skipped counts the documents left out of the shard, by reason.
	Skipped     Skips  `json:"skipped,omitempty"`
	SkipReason  string `json:"skip_reason,omitempty"`
	SkipMessage string `json:"skip_message,omitempty"`
	// Layout places the shard's documents in its file, from its first
	// record read (Layout.From), so that an append that reaches a limit
	// takes the documents that fit and records where in the file they
	// end. Nil in a shard made by a build before layouts, which is
	// appended whole or not at all.
	Layout *Layout `json:"layout,omitempty"`
	Limits
}

func (AppendJob) Kind() string { return KindAppend }

// from is the file's record the job's shard starts at.
func (j AppendJob) from() int64 {
	if j.Layout == nil {
		return 0
	}
	return j.Layout.From
}

// PlanResult is what a plan found; the caller enqueues Shards in order.
type PlanResult struct {
	Revision string
	Files    int // files planned (after MaxFiles)
	Done     int // of those, already appended or skipped in the store
	// Same counts the files whose content another file of the plan
	// already has (a second path to the same bytes): one shard holds it.
	Same   int
	Shards []ShardJob
}

// Rests counts the files of the plan the store holds part of, whose shards
// read the rest of them.
func (r PlanResult) Rests() int {
	n := 0
	for _, sj := range r.Shards {
		if sj.From > 0 {
			n++
		}
	}
	return n
}

// StoreStatus is the summary of a token store that the append step keeps in
// object storage after every commit, so that planning and shard workers on
// other machines can see how far the store has come without its disk.
type StoreStatus struct {
	Tokens    int64 `json:"tokens"`
	Documents int64 `json:"documents"`
	// Bytes is the committed size of tokens.bin.
	Bytes  int64 `json:"bytes"`
	Shards int   `json:"shards"`
	// Done lists the ids appended or recorded as skipped whole, sorted.
	Done []string `json:"done"`
	// Partial lists the files the store holds part of, sorted by id: an
	// append that reached a limit took their leading documents. A plan
	// queues the rest of each, from its record Next.
	Partial []PartialFile `json:"partial,omitempty"`
	// Full holds the limits at which an append left out a document that
	// would pass them. The store is then full at them, and at any lower limit:
	// a shard or plan under such a limit stops before it downloads or
	// tokenizes a file, which would only be refused at its append too,
	// rather than reading the rest of the dataset for nothing. An append
	// under a larger limit, or none, clears it. Zero: not full (a status
	// from before the field reads so).
	//
	// It is kept as "full_at", not "full": an older kiln wrote "full" where
	// an append refused a whole file at a limit, with room left for some
	// of its documents, and a status carries no version to tell the two
	// apart. Such a "full" reads as not full, so the same ingest after an
	// upgrade fills the store to its limit, and the first append that
	// leaves a document out marks the store full_at. A "full" that a later
	// build wrote with this meaning reads so too: that costs one plan's
	// shards, tokenized and refused at their appends, once.
	Full Limits `json:"full_at,omitzero"`
	// Tokenizer wrote the store's ids: work with another one is refused
	// before it downloads or tokenizes a file. Zero in a status from
	// before the field, and for a store never appended to.
	Tokenizer tokens.Tokenizer `json:"tokenizer,omitzero"`
	// Damaged says, where the worker that holds the store found its files
	// damaged (tokens.bin cut short or gone, the manifest unreadable), how
	// and what to do, in one line: plans into the store and runs over it
	// are refused until it is deleted or mended, where they would take
	// its files for stored. The other fields are its last whole status.
	Damaged string    `json:"damaged,omitempty"`
	Updated time.Time `json:"updated"`
}

// DamagedError is work refused because the token store it names is
// damaged (StoreStatus.Damaged).
type DamagedError struct {
	Store, Damaged string
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("token store %s is damaged: %s", e.Store, e.Damaged)
}

// BadInput marks the refusal as one a retry cannot mend: a person has to
// delete or mend the store.
func (e *DamagedError) BadInput() bool { return true }

// CheckDamaged refuses work with the store of status st where it is
// damaged.
func (st StoreStatus) CheckDamaged(storeName string) error {
	if st.Damaged != "" {
		return &DamagedError{Store: storeName, Damaged: st.Damaged}
	}
	return nil
}

// done reports whether id is in the store, appended or skipped whole.
func (st StoreStatus) done(id string) bool {
	_, ok := slices.BinarySearch(st.Done, id)
	return ok
}

// partial is the part of the file id the store holds, if it holds part
// of it.
func (st StoreStatus) partial(id string) (PartialFile, bool) {
	i, ok := slices.BinarySearchFunc(st.Partial, id, func(pf PartialFile, id string) int { return strings.Compare(pf.ID, id) })
	if !ok {
		return PartialFile{}, false
	}
	return st.Partial[i], true
}

// StatusKey is the object key of a store's status.
func StatusKey(storeName string) string { return "tokens/" + storeName + "/status.json" }

// ShardPrefix is the object-store prefix of a store's waiting shard files.
func ShardPrefix(storeName string) string { return "tokens/" + storeName + "/shards/" }

var unsafeKeyChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// ShardObject is the key of a shard's token file. Shard ids hold slashes
// and globs ("local:data/*.parquet/data/a.parquet"), so the key is a hash
// of the id, with the file's name after it for people browsing the bucket.
func ShardObject(storeName, shardID string) string {
	return shardObject(storeName, shardID, shardID, "")
}

// restObject is the key of the shard of a file's records from record
// from on: the rest of a file the store holds part of has a key of its
// own, so that it never meets a shard of the whole file in the bucket.
func restObject(storeName, shardID string, from int64) string {
	if from == 0 {
		return ShardObject(storeName, shardID)
	}
	n := strconv.FormatInt(from, 10)
	// No id holds a NUL: hub paths are git paths, local ids hashes.
	return shardObject(storeName, shardID+"\x00"+n, shardID, ".from-"+n)
}

// shardKey is the key of job's shard token file: restObject's, and for
// an ingest with limits one of its own for them. Two ingests of one file
// into one store with other limits (one queued while the other runs) then
// each append their own shard: the append that stops at its limit deletes
// its shard, and the other's, which its append still needs, stays. A
// retry of the same job writes the same key.
func shardKey(job ShardJob) string {
	if job.Limits == (Limits{}) {
		return restObject(job.Store, job.ShardID, job.From)
	}
	n := strconv.FormatInt(job.From, 10)
	lim := fmt.Sprintf("%d.%d", job.Limits.MaxTokens, job.Limits.MaxDisk)
	suffix := ".max-" + lim
	if job.From > 0 {
		suffix = ".from-" + n + suffix
	}
	return shardObject(job.Store, job.ShardID+"\x00"+n+"\x00"+lim, job.ShardID, suffix)
}

func shardObject(storeName, key, shardID, suffix string) string {
	h := sha256.Sum256([]byte(key))
	base := unsafeKeyChars.ReplaceAllString(filepath.Base(filepath.FromSlash(shardID)), "_")
	return ShardPrefix(storeName) + hex.EncodeToString(h[:8]) + "-" + strings.TrimLeft(base, ".") + suffix + ".tokens"
}

// CheckStoreName refuses a store name that would not stay one directory
// and one object-store path element.
func CheckStoreName(name string) error {
	if err := store.CheckName("token store", name); err != nil {
		return &PresetError{err}
	}
	return nil
}

func (p *Pipeline) log() *zap.Logger {
	if p.Logger == nil {
		return zap.NewNop()
	}
	return p.Logger
}

// Status reads a store's status from object storage; a store that has
// never been appended to has the zero status.
func (p *Pipeline) Status(ctx context.Context, storeName string) (StoreStatus, error) {
	var st StoreStatus
	if p.holdsStores() {
		p.statusesMu.Lock()
		st, held := p.statuses[storeName]
		p.statusesMu.Unlock()
		if held {
			return st, nil
		}
	}
	r, err := p.Objects.Get(ctx, StatusKey(storeName))
	if errors.Is(err, store.ErrNotFound) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("reading the status of token store %s: %w", storeName, err)
	}
	defer r.Close()
	if err := json.NewDecoder(r).Decode(&st); err != nil {
		return st, fmt.Errorf("reading the status of token store %s (%s): %w", storeName, StatusKey(storeName), err)
	}
	return st, nil
}

// reached says why a store at st has no room left, or "": it is at the
// limit, or an append left out a document at this limit or a larger one.
func (l Limits) reached(storeName string, st StoreStatus) string {
	switch {
	case l.MaxTokens > 0 && st.Tokens >= l.MaxTokens:
		return fmt.Sprintf("ingest into token store %s stopped: it holds %d tokens, --max-tokens is %d", storeName, st.Tokens, l.MaxTokens)
	case l.MaxDisk > 0 && st.Bytes >= l.MaxDisk:
		return fmt.Sprintf("ingest into token store %s stopped: its tokens take %d bytes, --max-disk is %d", storeName, st.Bytes, l.MaxDisk)
	case l.MaxTokens > 0 && st.Full.MaxTokens >= l.MaxTokens:
		return fmt.Sprintf("ingest into token store %s stopped: it holds %d tokens and is full at --max-tokens %d (a document that would pass --max-tokens %d was left out)",
			storeName, st.Tokens, l.MaxTokens, st.Full.MaxTokens)
	case l.MaxDisk > 0 && st.Full.MaxDisk >= l.MaxDisk:
		return fmt.Sprintf("ingest into token store %s stopped: its tokens take %d bytes and it is full at --max-disk %d (a document that would pass --max-disk %d was left out)",
			storeName, st.Bytes, l.MaxDisk, st.Full.MaxDisk)
	}
	return ""
}

// fullAfter is what a store's Full becomes after an append under the
// job's limits (or one that left a document out at refused): the largest limit
// refused so far stays while appends come under it or a lower one (shards
// tokenized before the refusal that still fit), and goes once an append
// comes under a larger limit or none (the user raised it).
func (full Limits) fullAfter(job, refused Limits) Limits {
	after := func(full, job, refused int64) int64 {
		switch {
		case refused > 0:
			return max(full, refused)
		case job > 0 && job <= full:
			return full
		}
		return 0
	}
	return Limits{MaxTokens: after(full.MaxTokens, job.MaxTokens, refused.MaxTokens), MaxDisk: after(full.MaxDisk, job.MaxDisk, refused.MaxDisk)}
}

// Plan lists the job's dataset in its seeded order and returns a ShardJob
// for every file that the store does not yet hold, in that order: for a
// file the store holds part of, a ShardJob of its rest.
func (p *Pipeline) Plan(ctx context.Context, job PlanJob) (PlanResult, error) {
	var res PlanResult
	if err := CheckStoreName(job.Store); err != nil {
		return res, err
	}
	if job.Tokenizer == "" {
		return res, &PresetError{fmt.Errorf("ingest of %s names no tokenizer: set KILN_TOKENIZER or --tokenizer", job.Dataset)}
	}
	presets := p.Presets
	if presets == nil && job.Preset == nil {
		var err error
		if presets, err = Presets(""); err != nil {
			return res, err
		}
	}
	preset, err := ResolvePreset(presets, job.Dataset, job.Preset)
	if err != nil {
		return res, err
	}
	if preset, err = preset.WithVars(job.Vars); err != nil {
		return res, err
	}
	if job.Revision != "" && preset.Glob == "" {
		preset.Revision = job.Revision
	}
	status, err := p.Status(ctx, job.Store)
	if err != nil {
		return res, err
	}
	if err := status.CheckDamaged(job.Store); err != nil {
		return res, err
	}
	if status.Tokenizer.SHA256 != "" && p.Tokenizer != nil {
		tok, err := p.Tokenizer(ctx, job.Tokenizer)
		if err != nil {
			return res, err
		}
		if err := tokens.CheckWrittenWith(job.Store, status.Tokenizer, tokens.Tokenizer{Name: job.Tokenizer, SHA256: tok.SHA256()}); err != nil {
			return res, err
		}
	}
	if msg := job.Limits.reached(job.Store, status); msg != "" {
		return res, &StopError{Msg: msg + stopHint}
	}
	listed, err := Plan(ctx, preset, p.Hub, job.Seed)
	if job.Revision != "" {
		err = pinnedRevision(err, "--revision", job.Revision, "")
	}
	if err != nil {
		return res, err
	}
	var pinned string
	if preset.Repo != "" && NamesCommit(preset.Revision, listed.Revision) {
		pinned = revisionSetting(job)
	}
	if preset.Glob != "" {
		for _, f := range listed.Files {
			if err := CheckLocalPath(p.LocalRoots, f.Path); err != nil {
				return res, err
			}
		}
	}
	if preset.Repo != "" {
		if err := p.clearRefused(ctx, job.Store); err != nil {
			return res, err
		}
	}
	res.Revision = listed.Revision
	files := listed.Files
	if job.MaxFiles > 0 && len(files) > job.MaxFiles {
		files = files[:job.MaxFiles]
	}
	res.Files = len(files)
	if preset.Glob != "" {
		if err := hashLocal(ctx, files); err != nil {
			return res, err
		}
	}
	planned := map[string]bool{}
	for _, f := range files {
		id := fileShardID(preset, f)
		if status.done(id) || preset.Glob != "" && status.done(legacyShardID(preset, f.Path)) {
			res.Done++
			continue
		}
		if planned[id] {
			// The same content under a second path: one shard holds it.
			res.Same++
			continue
		}
		planned[id] = true
		sj := ShardJob{Dataset: preset.Name, Repo: preset.Repo, Revision: listed.Revision, Path: f.Path, Size: f.Size,
			GitOID: f.OID, Columns: preset.Columns, Store: job.Store, Tokenizer: job.Tokenizer, ShardID: id, Pinned: pinned, Limits: job.Limits}
		if pf, ok := status.partial(id); ok {
			sj.From = pf.Next
		}
		if f.LFS != nil {
			sj.Size, sj.SHA256, sj.GitOID = f.LFS.Size, f.LFS.OID, ""
		}
		res.Shards = append(res.Shards, sj)
	}
	return res, nil
}

// file is the hub's description of the job's file, for Download to verify.
func (j ShardJob) file() hub.File {
	f := hub.File{Path: j.Path, Type: "file", Size: j.Size, OID: j.GitOID}
	if j.SHA256 != "" {
		f.LFS = &hub.LFS{OID: j.SHA256, Size: j.Size}
	}
	return f
}

// Shard turns one file into a shard token file in object storage: download
// into this machine's data directory, decode, and tokenize on all cores
// with EOS after each document, the tokens streaming to object storage as
// they are made; then delete the download. The returned AppendJob is what
// the append step needs; a file that cannot be read (corrupt, empty, an
// unsafe path) becomes an AppendJob that records the skip, not an error,
// since retrying it would give the same answer. Done is true when the store
// already holds the file: there is nothing to append.
func (p *Pipeline) Shard(ctx context.Context, job ShardJob, say func(msg string)) (out AppendJob, done bool, err error) {
	if say == nil {
		say = func(string) {}
	}
	if err := CheckStoreName(job.Store); err != nil {
		return out, false, err
	}
	if job.ShardID == "" {
		return out, false, &PresetError{fmt.Errorf("shard of %s has no shard id: enqueue it through ingest:plan", job.Path)}
	}
	if job.Repo == "" {
		if err := CheckLocalPath(p.LocalRoots, job.Path); err != nil {
			return out, false, err
		}
	}
	if p.Tokenizer == nil {
		return out, false, errors.New("this worker has no tokenizer catalog configured")
	}
	tok, err := p.Tokenizer(ctx, job.Tokenizer)
	if err != nil {
		return out, false, err
	}
	eos, ok := tok.EOS()
	if !ok {
		return out, false, &PresetError{fmt.Errorf("tokenizer %s has no end-of-text token: train or pick one with an EOS special token", job.Tokenizer)}
	}
	out = AppendJob{Store: job.Store, ShardID: job.ShardID, Dataset: job.Dataset, Source: job.Path, Revision: job.Revision,
		Tokenizer: tokens.Tokenizer{Name: job.Tokenizer, SHA256: tok.SHA256(), VocabSize: tok.VocabSize(), EOS: eos}, Limits: job.Limits}
	status, err := p.Status(ctx, job.Store)
	if err != nil {
		return out, false, err
	}
	if err := tokens.CheckWrittenWith(job.Store, status.Tokenizer, out.Tokenizer); err != nil {
		return out, false, err
	}
	if _, ok := slices.BinarySearch(status.Done, job.ShardID); ok {
		return out, true, nil
	}
	// The store may have taken more of the file since the plan: only what
	// it lacks is read.
	if pf, ok := status.partial(job.ShardID); ok && pf.Next > job.From {
		job.From = pf.Next
	}
	if msg := job.Limits.reached(job.Store, status); msg != "" {
		return out, false, &StopError{Msg: msg + "; " + job.Path + " was not read" + stopHint}
	}
	skipped := func(err error) (AppendJob, bool, error) {
		out.SkipReason, out.SkipMessage = SkipReason(err), err.Error()
		p.log().Warn("file skipped", zap.String("file", job.Path), zap.String("reason", out.SkipReason), zap.Error(err))
		return out, false, nil
	}

	local := job.Path
	if job.Repo != "" {
		if p.Hub == nil {
			return out, false, fmt.Errorf("%s is in hub dataset %s, and this worker has no hub client", job.Path, job.Repo)
		}
		if err := p.checkRefused(ctx, job); err != nil {
			return out, false, err
		}
		dl := downloadDir(p.DataDir, job.Store, job.ShardID)
		dst, err := SafeJoin(dl, job.Path)
		if SkipReason(err) != "" {
			return skipped(err)
		}
		if err != nil {
			return out, false, err
		}
		p.removeStaleDownloads()
		held, err := holdDownload(dl)
		if err != nil {
			return out, false, err
		}
		downloaded := false
		defer func() {
			// The download goes as soon as it is tokenized (and on any
			// error): a worker's disk holds one raw file per task at most.
			if !downloaded {
				held.Release()
			} else if err := held.Remove(); err != nil {
				p.log().Warn("download not removed; a later shard removes it", zap.String("dir", dl), zap.Error(err))
			}
		}()
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return out, false, err
		}
		say("downloading " + job.Path)
		notify := hub.SayRetries(ctx, "downloading "+job.Path, say)
		if err := p.Hub.Download(notify, job.Repo, job.Revision, job.file(), dst); err != nil {
			if job.Pinned != "" {
				err = pinnedRevision(err, job.Pinned, job.Revision, job.Path)
			}
			p.markRefused(ctx, job, err)
			return out, false, noRoom(err, filepath.Dir(dst), fmt.Sprintf("the %d bytes of %s", job.Size, job.Path))
		}
		downloaded = true
		local = dst
		// An append may have filled the store during the download; the
		// tokenization would cost more than the download (a file of
		// Software Heritage ids fetches every blob it names) and its shard
		// would only be refused.
		if job.Limits != (Limits{}) {
			if status, err = p.Status(ctx, job.Store); err != nil {
				return out, false, err
			}
			if msg := job.Limits.reached(job.Store, status); msg != "" {
				return out, false, &StopError{Msg: msg + "; " + job.Path + " was downloaded but not tokenized" + stopHint}
			}
		}
	}
	// A local file planned by its content is tokenized from a copy of
	// that content (localcopy.go); one queued before ids were contents
	// names no content to check, and is read where it is.
	var settled func() error
	if job.Repo == "" && job.SHA256 != "" {
		say("copying " + job.Path)
		c, err := p.copyLocal(ctx, job)
		if err != nil {
			return out, false, err
		}
		defer c.remove(p.log())
		local, settled = c.path, c.settled
	}
	key := shardKey(job)
	say("tokenizing " + job.Path)
	// What the store has room for now: it only fills, so its append has
	// no more room, and the documents past it are left unread.
	room := job.Limits.room(status.Tokens, tokens.DtypeFor(tok.VocabSize()).Width())
	st, err := p.tokenize(ctx, job, local, key, tok, room, settled, say)
	if SkipReason(err) != "" {
		return skipped(err)
	}
	if err != nil {
		p.markRefused(ctx, job, err)
		return out, false, noRoom(err, "", "the shard of "+job.Path)
	}
	if job.Repo != "" {
		os.Remove(local)
	}
	out.Layout = st.Layout
	switch {
	case st.Documents == 0 && job.From == 0:
		return skipped(&SkipError{Reason: SkipEmptyFile, Path: job.Path, Err: fmt.Errorf("no usable documents (skipped: %s)", st.Skips)})
	case st.Documents == 0:
		// The rest of a file that holds no documents: its append records
		// the file whole, with the records it left out, and no object
		// was made.
		key = ""
	}
	out.Object, out.SHA256, out.Documents, out.Tokens, out.Skipped = key, st.SHA256, st.Documents, st.Tokens, st.Skips
	return out, false, nil
}

// removeStaleDownloads removes from the data directory what shard tasks
// that ended for good left (RemoveStaleDownloads); a failed attempt's
// partial download stays for its retry to resume.
func (p *Pipeline) removeStaleDownloads() {
	stale, err := RemoveStaleDownloads(p.DataDir, time.Now())
	for _, s := range stale {
		p.log().Info("removed a download that no shard task is left to finish", zap.String("path", s))
	}
	if err != nil {
		p.log().Warn("stale downloads not removed; the next shard tries again", zap.Error(err))
	}
}

// DefaultTokenizing is how many shards a worker reads and tokenizes at
// once (Pipeline.Tokenizing): one per 8 cores, at least two. The shards
// share the process's encoders (one per core), so more shards add readers
// and decoders, not encoders: a file's parquet reader is one goroutine
// where the file is one row group, and more cores need more files at once
// to be fed (docs/benchmarks/ingest.md).
func DefaultTokenizing() int { return max(2, runtime.GOMAXPROCS(0)/8) }

// tokenize streams the shard of local into object storage at key while it
// is being tokenized, so that the upload overlaps with tokenization and no
// copy of the tokens waits on this machine's disk. The object exists only
// if every token was written: an error on either side ends the other (the
// upload is aborted, never completed), and the caller enqueues no append.
// The SHA-256 that the append verifies is taken from the same bytes as they
// are written, so the upload itself need not sign them.
//
// The shard holds a place in p.Tokenizing from opening the file until its
// last token is written; the wait for the upload's last part and its
// completion leaves the cores to the next shard, and is said (say): a
// shard of less than a part is sent whole then, which a slow or hung
// store holds for minutes.
//
// settled, when set, is asked once the file is read whether the shard may
// stand for it (localCopy.settled): an error ends the shard as any write
// error does, its upload aborted.
func (p *Pipeline) tokenize(ctx context.Context, job ShardJob, local, key string, tok *tokenizer.Tokenizer, room int64, settled func() error, say func(string)) (ShardStats, error) {
	if p.Tokenizing != nil {
		if err := p.Tokenizing.Acquire(ctx, 1); err != nil {
			return ShardStats{}, fmt.Errorf("waiting to tokenize %s: %w", job.Path, err)
		}
	}
	up := &upload{ctx: ctx, objects: p.Objects, key: key}
	st, err := p.write(ctx, job, local, tok, up, room, settled)
	if p.Tokenizing != nil {
		p.Tokenizing.Release(1)
	}
	if err == nil {
		say("uploading the shard of " + job.Path)
	}
	// A write that failed because the upload did carries the upload's own
	// error; one that failed for its own reason keeps it, and says so if
	// the upload could not be dropped either.
	if uerr := up.finish(err); uerr != nil {
		if err == nil || errors.Is(err, uerr) {
			err = fmt.Errorf("uploading the shard of %s to %s: %w", job.Path, key, uerr)
		} else {
			err = fmt.Errorf("%w; dropping the unfinished upload of its shard to %s failed too: %v", err, key, uerr)
		}
	}
	return st, err
}

// write tokenizes local into up, from the job's first record to the
// document that passes room (writeShard); the file is closed, and its
// decoders stopped, when it returns. A shard made, or a file skipped, is
// then the error of settled where it has one: a skip is recorded under
// the file's id as surely as a shard.
func (p *Pipeline) write(ctx context.Context, job ShardJob, local string, tok *tokenizer.Tokenizer, up *upload, room int64, settled func() error) (st ShardStats, err error) {
	if settled != nil {
		defer func() {
			if err == nil || SkipReason(err) != "" {
				if serr := settled(); serr != nil {
					st, err = ShardStats{}, serr
				}
			}
		}()
	}
	src, err := Open(ctx, local, OpenOptions{Name: job.Path, Columns: job.Columns, SWH: p.SWH, DecodeAhead: p.DecodeAhead, From: job.From})
	if err != nil {
		return ShardStats{}, err
	}
	defer src.Close()
	return writeShard(ctx, src, tok, up, job.From, room)
}

// upload is a writer whose bytes go to one object as they come, through
// the store's streaming writer: for S3, part buffers reused across the
// worker's shards and filled straight from each chunk of tokens. The put
// starts at the first write, so a file with no usable documents leaves no
// object behind.
type upload struct {
	ctx     context.Context
	objects store.Store
	key     string
	w       store.Writer
}

func (u *upload) Write(b []byte) (int, error) {
	if u.w == nil {
		u.w = store.NewUnsignedWriter(u.ctx, u.objects, u.key)
	}
	return u.w.Write(b)
}

// finish ends the upload: completes the object when writeErr is nil, and
// otherwise aborts it. It returns the upload's own error: the one a write
// returned, if the upload failed first, or the abort's.
func (u *upload) finish(writeErr error) error {
	if u.w == nil {
		return nil
	}
	if writeErr != nil {
		return u.w.Abort(writeErr)
	}
	return u.w.Close()
}

// AppendResult is what an append did.
type AppendResult struct {
	// Duplicate: the store already held the shard; nothing was written.
	Duplicate bool
	// Skipped: the job recorded a skipped file.
	Skipped   bool
	Tokens    int64 // appended by this job
	Documents int64 // of the shard's documents, those appended by this job
	// Part: the job appended part of its file, the rest of which waits
	// for a plan: at a limit, with the StopError that says so.
	Part   bool
	Status StoreStatus
}

// Append commits one AppendJob to its store, exactly once per shard id:
// the shard object is streamed through the store's appender, the documents
// the shard left out are recorded, the store's status is published, and the
// shard object is deleted. A job whose shard is already in the store (a
// retry after a crash) only finishes what the first attempt did not.
// A shard that would take the store past the job's limits is appended in
// part: its leading documents that fit, recorded as the part of its file
// they came from, and the StopError that ends the ingest says so.
// progress, when set, is told how many of the shard's bytes are in.
func (p *Pipeline) Append(ctx context.Context, job AppendJob, progress func(done, total int64)) (AppendResult, error) {
	res, err := p.append(ctx, job, progress)
	if err != nil && p.StoresDir != "" {
		dir := filepath.Join(p.StoresDir, job.Store)
		what := "the record of " + job.Source + " as skipped"
		if job.SkipReason == "" {
			what = fmt.Sprintf("the %d bytes of tokens of %s", job.Tokens*int64(tokens.DtypeFor(job.Tokenizer.VocabSize).Width()), job.Source)
		}
		if fi, serr := os.Stat(filepath.Join(dir, tokens.ManifestFile)); serr == nil {
			// Each append writes a new copy of it beside the old one:
			// the room the tokens need is not enough.
			what += fmt.Sprintf(" and a new copy of its manifest.json (%s)", bytesize.Format(fi.Size()))
		}
		err = noRoom(err, dir, what)
	}
	return res, err
}

func (p *Pipeline) append(ctx context.Context, job AppendJob, progress func(done, total int64)) (AppendResult, error) {
	var res AppendResult
	if err := CheckStoreName(job.Store); err != nil {
		return res, err
	}
	if p.StoresDir == "" {
		return res, errors.New("this worker has no token store directory configured: it cannot serve the append queue")
	}
	if job.SkipReason == "" {
		// Every shard a plan of kiln's queues is under its store's
		// prefix: another key was made by no plan, and no retry reads it.
		if err := store.CheckKey(job.Object); err != nil || !strings.HasPrefix(job.Object, ShardPrefix(job.Store)) {
			return res, &PresetError{fmt.Errorf("the append of shard %s names object %q, which is not a shard of token store %s (under %s): no plan of kiln's queued it; enqueue the ingest again ('sched enqueue ingest')",
				job.ShardID, job.Object, job.Store, ShardPrefix(job.Store))}
		}
	}
	dir := filepath.Join(p.StoresDir, job.Store)
	// The shard's bytes are read and checked before the store is taken, so
	// that with two append tasks at once one downloads and checks while the
	// other writes and commits.
	var pre *prefetched
	if job.SkipReason == "" {
		var err error
		if pre, err = p.prefetch(ctx, dir, job, progress); err != nil {
			return res, err
		}
	}
	unlock := lockStoreHere(dir)
	defer unlock()
	app, done, err := p.appender(ctx, dir, job.Tokenizer)
	if err != nil {
		p.publishTokenizer(ctx, dir, job)
		return res, err
	}
	defer done()
	base := tokens.Skipped{ID: job.ShardID, Source: job.Source, Revision: job.Revision}
	m := app.Manifest()
	in := m.Input(job.ShardID)

	if job.SkipReason != "" {
		s := base
		s.Reason = job.SkipReason + ": " + job.SkipMessage
		switch {
		case in.Whole:
			// A retry of the record of a file's rest, below.
			res.Duplicate = true
		case in.Partial():
			// The rest of a file whose leading documents are in cannot be
			// read (a damaged row group past them): the store holds the
			// file whole, its rest recorded as left out.
			s.From = in.Next
			info := tokens.ShardInfo{ID: job.ShardID, Source: job.Source, Revision: job.Revision, Part: tokens.Part{From: in.Next}, Skipped: []tokens.Skipped{s}}
			if _, err := app.Append(ctx, info, bytes.NewReader(nil)); err != nil {
				return res, err
			}
			res.Skipped = true
		default:
			if err := app.Skip(ctx, s); err != nil {
				return res, err
			}
			res.Skipped = true
		}
		res.Status, err = p.publishStatus(ctx, job.Store, app.Manifest(), job.Limits, Limits{})
		return res, err
	}

	if in.Whole {
		res.Duplicate = true
		// A store appended to before shards carried the documents they
		// left out holds the shard without their record.
		if in.Shards == 1 {
			if err := RecordSkips(ctx, app, base, job.Skipped); err != nil {
				return res, err
			}
		}
	} else if res, err = p.appendShard(ctx, app, job, pre, in, progress); err != nil {
		return res, err
	}
	if res.Status, err = p.publishStatus(ctx, job.Store, app.Manifest(), job.Limits, Limits{}); err != nil {
		return res, err
	}
	// Deleted last: until the status says the shard is in, a lost delete
	// only leaves garbage, while an early one could lose the shard.
	err = p.deleteShard(ctx, job)
	var lapsed *LeaseError
	if err != nil && !errors.As(err, &lapsed) {
		err = fmt.Errorf("deleting the appended shard %s: %w", job.Object, err)
	}
	return res, err
}

// appendShard appends to app's store, which holds in of the job's file
// and not all of it, what fits of the job's shard: all of it, or, where
// that would pass the job's limits, its documents the store lacks that fit
// (none, when the next does not), recorded as the part of the file they
// came from. The decision and the commit are made holding the store, so
// that of appends at once each sees the others' tokens; the part is one
// commit (tokens.Appender), so a crash leaves it in or out, never half,
// and a retry decides again from what is in.
//
// Where the store reached a limit, the store's status is published full at
// it, the shard object deleted, and the StopError that ends the ingest
// returned.
func (p *Pipeline) appendShard(ctx context.Context, app *tokens.Appender, job AppendJob, pre *prefetched, in tokens.Input, progress func(done, total int64)) (AppendResult, error) {
	var res AppendResult
	m := app.Manifest()
	width := m.Dtype.Width()
	from := job.from()
	if from > in.Next {
		return res, &PresetError{fmt.Errorf("the shard of %s for token store %s starts at its record %d, and the store holds its records up to %d only: appending it would leave the ones between out; plan the ingest again, which reads the file from there",
			job.Source, job.Store, from, in.Next)}
	}
	room := job.Limits.room(m.Tokens, width)
	if from == in.Next && job.Tokens <= room && (job.Layout == nil || job.Layout.To == 0) {
		info := job.shardInfo()
		ar, err := p.appendWhole(ctx, app, job, info, pre, progress)
		res.Tokens, res.Documents = ar.Shard.Tokens, job.Documents
		return res, err
	}
	if job.Layout == nil {
		if from < in.Next {
			return res, &PresetError{fmt.Errorf("the shard of %s for token store %s holds the file from record %d, the store holds its records up to %d, and the shard, made by an earlier kiln build, does not say where its documents lie in the file: run the workers of one build and plan the ingest again",
				job.Source, job.Store, from, in.Next)}
		}
		passed := job.Limits.passed(m.Tokens, job.Tokens, width)
		return res, p.stop(ctx, job, m, passed, fmt.Sprintf("ingest into token store %s stopped before %s: the store holds %d tokens and this shard's %d would pass %s (the shard, made by an earlier kiln build, can only be appended whole)",
			job.Store, job.Source, m.Tokens, job.Tokens, limitsText(passed)))
	}
	if err := job.Layout.check(job.Documents); err != nil {
		return res, &PresetError{fmt.Errorf("the shard of %s for token store %s has a layout that does not fit its %d documents (%v): run its ingest:shard task again", job.Source, job.Store, job.Documents, err)}
	}
	lead := job.Layout.docsBefore(in.Next)
	c, data, err := p.findCut(ctx, job, pre, lead, room, m.Tokenizer.EOS, m.Dtype)
	var missing *MissingShardError
	if errors.As(err, &missing) && from < in.Next {
		// An attempt of this append before took a part of the shard and
		// then deleted it, having published the store's status: the task
		// was retried after that (a worker lost before it could say so).
		if _, err := p.publishStatus(ctx, job.Store, m, job.Limits, Limits{}); err != nil {
			return res, err
		}
		return res, &StopError{Msg: fmt.Sprintf("ingest into token store %s stopped in %s: the store holds its records up to %d, which an earlier attempt of this append took before its shard was deleted",
			job.Store, job.Source, in.Next) + stopHint}
	}
	if err != nil {
		return res, err
	}
	rest := "the rest of " + job.Source
	if in.Next == 0 {
		rest = job.Source
	}
	if c.Docs == 0 && lead < job.Documents {
		passed := job.Limits.passed(m.Tokens, c.Next, width)
		msg := fmt.Sprintf("ingest into token store %s stopped before %s: the store holds %d tokens, and the next document's %d would pass %s",
			job.Store, rest, m.Tokens, c.Next, limitsText(passed))
		if passed.MaxTokens == 0 {
			msg = fmt.Sprintf("ingest into token store %s stopped before %s: its next document's %d bytes of tokens would take the store from %d to %d bytes, past %s",
				job.Store, rest, c.Next*int64(width), m.Tokens*int64(width), (m.Tokens+c.Next)*int64(width), limitsText(passed))
		}
		return res, p.stop(ctx, job, m, passed, msg)
	}
	to := job.Layout.To // all the shard's documents fit: up to where it ends
	if lead+c.Docs < job.Documents {
		to = job.Layout.recordOf(lead + c.Docs)
	}
	part := tokens.Part{From: in.Next, To: to}
	info := tokens.ShardInfo{ID: job.ShardID, Source: job.Source, Revision: job.Revision, Part: part,
		Skipped: skipRecords(tokens.Skipped{ID: job.ShardID, Source: job.Source, Revision: job.Revision, From: part.From}, job.Layout.skipsIn(in.Next, to))}
	var ar tokens.AppendResult
	if data != nil {
		checked, err := tokens.CheckShard(filepath.Join(p.StoresDir, job.Store), info, job.Tokenizer, cutData(data, width, c))
		if err != nil {
			return res, err
		}
		ar, err = app.AppendChecked(ctx, checked)
		if err != nil {
			return res, err
		}
	} else {
		err := readIntact(job, func() error {
			body, err := p.getShard(ctx, job)
			if err != nil {
				return err
			}
			defer body.Close()
			cr, err := newCutReader(body, width, c, job.sum(p.StoresDir))
			if err != nil {
				return fmt.Errorf("reading shard %s: %w", job.Object, err)
			}
			ar, err = app.Append(ctx, info, &countingReader{r: cr, total: (c.End - c.Start) * int64(width), progress: progress})
			return cr.refusal(err)
		})
		if err != nil {
			return res, err
		}
	}
	res.Tokens, res.Documents = ar.Shard.Tokens, c.Docs
	if to == 0 {
		return res, nil
	}
	res.Part = true
	if c.Next == 0 {
		// A shard that stops short of its file (made for less room than
		// the store has: a part of the file went in since), all of it in:
		// the store is not full, and a plan reads the file's rest.
		return res, nil
	}
	m = app.Manifest()
	now := m.Input(job.ShardID)
	passed := job.Limits.passed(m.Tokens, c.Next, width)
	err = p.stop(ctx, job, m, passed, fmt.Sprintf("ingest into token store %s reached %s with part of %s taken: its first %d documents are in the store (%d tokens), the rest of the file is not; the store holds %d tokens",
		job.Store, limitsText(passed), job.Source, now.Documents, now.Tokens, m.Tokens))
	if stop, ok := err.(*StopError); ok {
		stop.Tokens = res.Tokens
	}
	return res, err
}

// appendWhole appends all of the job's shard as info says.
func (p *Pipeline) appendWhole(ctx context.Context, app *tokens.Appender, job AppendJob, info tokens.ShardInfo, pre *prefetched, progress func(done, total int64)) (tokens.AppendResult, error) {
	if pre != nil {
		return app.AppendChecked(ctx, pre.checked)
	}
	width := int64(tokens.DtypeFor(job.Tokenizer.VocabSize).Width())
	var ar tokens.AppendResult
	err := readIntact(job, func() error {
		body, err := p.getShard(ctx, job)
		if err != nil {
			return err
		}
		defer body.Close()
		ar, err = app.Append(ctx, info, &countingReader{r: body, total: job.Tokens * width, progress: progress})
		return err
	})
	return ar, err
}

// findCut finds what an append takes of the job's shard: the documents
// after the first lead that fit in room tokens. It reads the shard held
// in memory (pre) or from object storage, again where it changed on its
// way (readIntact), and returns the shard's bytes where it holds them.
func (p *Pipeline) findCut(ctx context.Context, job AppendJob, pre *prefetched, lead, room int64, eos uint32, dtype tokens.Dtype) (shardCut, []byte, error) {
	var c shardCut
	cut := func(r io.Reader) (err error) {
		c, err = findCut(r, dtype, eos, job.Layout, job.Documents, lead, room, job.sum(p.StoresDir))
		// A shard changed on its way is read again; a store that fails as
		// it is read is an outage, which the task waits out: neither is
		// the stored shard's fault.
		if err != nil && !errors.As(err, new(*tokens.HashError)) && !store.Unreachable(err) && ctx.Err() == nil {
			err = &PresetError{fmt.Errorf("the shard of %s for token store %s cannot be cut at a document: %w; run its ingest:shard task again", job.Source, job.Store, err)}
		}
		return err
	}
	if pre != nil {
		return c, pre.data, cut(bytes.NewReader(pre.data))
	}
	err := readIntact(job, func() error {
		body, err := p.getShard(ctx, job)
		if err != nil {
			return err
		}
		defer body.Close()
		return cut(body)
	})
	return c, nil, err
}

// deleteShard deletes the job's shard object, if it made one, while the
// lease lasts: the deletion says that the store holds the shard, which,
// once another disk's worker may serve append, only that worker's store
// can say; the shard stays for it to append.
func (p *Pipeline) deleteShard(ctx context.Context, job AppendJob) error {
	if job.Object == "" {
		return nil
	}
	return p.leased(ctx, job.Store, "delete its appended shard "+job.Object, func(ctx context.Context) error {
		return p.Objects.Delete(ctx, job.Object)
	})
}

// publishTokenizer publishes, where an append was refused because another
// tokenizer wrote the store in dir, the store's status with that tokenizer
// if the status named none or another (a store a direct ingest made here,
// or one copied here, before the worker's start recorded it): the shards
// queued behind the refused one then stop before they download their
// file, as they do for a store whose status names its tokenizer, instead
// of each being downloaded and tokenized for an append that refuses it.
// The caller holds the store; a failure is logged, the refusal stands.
func (p *Pipeline) publishTokenizer(ctx context.Context, dir string, job AppendJob) {
	m, err := tokens.ReadManifest(dir)
	if err != nil || tokens.CheckWrittenWith(job.Store, m.Tokenizer, job.Tokenizer) == nil {
		return
	}
	st, err := p.Status(ctx, job.Store)
	if err == nil && st.Tokenizer.SHA256 == m.Tokenizer.SHA256 {
		return
	}
	if err == nil {
		_, err = p.publishStatus(ctx, job.Store, *m, Limits{}, Limits{})
	}
	if err != nil {
		p.log().Warn("the status of a token store another tokenizer wrote does not say so; the shards queued for it download their files before their appends are refused",
			zap.String("store", job.Store), zap.Error(err))
	}
}

// stop marks the store of m full at the limits that the next document of
// the job's shard would pass, so that the shards and plans under them stop
// before they read a file, deletes the shard (what the store did not take
// of it would only wait in object storage for a limit that is not coming:
// a plan under a larger one reads the file's rest again) and returns the
// StopError, which the caller reports: the worker as its task's outcome,
// Direct in its Report. The status is published first: should that fail,
// the task is retried with its shard still there.
func (p *Pipeline) stop(ctx context.Context, job AppendJob, m tokens.Manifest, refused Limits, msg string) error {
	if _, err := p.publishStatus(ctx, job.Store, m, job.Limits, refused); err != nil {
		return err
	}
	if err := p.deleteShard(ctx, job); err != nil {
		p.log().Warn("shard left in object storage", zap.String("object", job.Object), zap.Error(err))
	}
	return &StopError{Msg: msg + stopHint}
}

// publishStatus publishes the status of the store of m after an append
// under limits, whose shard refused says the limits that refused it
// (zero: not refused). The caller holds the store, so the Full read from
// the status before is the latest.
func (p *Pipeline) publishStatus(ctx context.Context, storeName string, m tokens.Manifest, limits, refused Limits) (StoreStatus, error) {
	done, partial := storeFiles(m)
	st := StoreStatus{Tokens: m.Tokens, Documents: m.Documents, Bytes: m.Tokens * int64(m.Dtype.Width()), Shards: len(m.Shards),
		Done: done, Partial: partial, Tokenizer: m.Tokenizer, Updated: time.Now().UTC()}
	// Without limits the marker goes whatever it was: no need to read it.
	if limits != (Limits{}) {
		before, err := p.Status(ctx, storeName)
		if err != nil {
			return st, err
		}
		st.Full = before.Full.fullAfter(limits, refused)
	}
	if p.holdsStores() {
		p.statusesMu.Lock()
		p.statuses[storeName] = st
		p.statusesMu.Unlock()
		return st, nil
	}
	return st, p.putStatus(ctx, storeName, st, "publish its status")
}

// putStatus writes st as the status of the store in object storage, under
// the store's lease (what, for a LeaseError, says what it was to do).
func (p *Pipeline) putStatus(ctx context.Context, storeName string, st StoreStatus, what string) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	err = p.leased(ctx, storeName, what, func(ctx context.Context) error {
		return p.Objects.Put(ctx, StatusKey(storeName), bytes.NewReader(b), int64(len(b)))
	})
	var lapsed *LeaseError
	if err != nil && !errors.As(err, &lapsed) {
		return fmt.Errorf("writing the status of token store %s (to %s): %w", storeName, what, err)
	}
	return err
}

// DefaultPrefetch is Pipeline.Prefetch's default: a larger shard streams
// from object storage into the store, and two appends at once hold at most
// twice this in memory.
const DefaultPrefetch = 64 << 20

// prefetched is a shard read whole before its append: its bytes, checked
// for an append of all of it.
type prefetched struct {
	data    []byte
	checked *tokens.CheckedShard
}

// prefetch reads the job's shard whole when it is at most p.Prefetch
// bytes and the store in dir does not hold all of its file yet, reporting
// progress, and makes the append's checks on it (ids, EOS, SHA-256:
// tokens.CheckShard); it returns nil, and no error, for a shard to be
// streamed instead or not read at all. A shard changed on its way here is
// read again (readIntact).
func (p *Pipeline) prefetch(ctx context.Context, dir string, job AppendJob, progress func(done, total int64)) (*prefetched, error) {
	var pre *prefetched
	err := readIntact(job, func() (err error) {
		pre, err = p.prefetchOnce(ctx, dir, job, progress)
		return err
	})
	return pre, err
}

// readIntact makes read, one read of the job's shard, again while what it
// read does not hash to what the shard step made (a *tokens.HashError),
// shardReads times in all: bytes changed on their way here (a middlebox,
// a faulty NIC) seldom change the same way twice. One that hashes the same
// wrong way each time is the stored object's, which no retry mends: that
// is bad input, saying to make the shard again. Every read of an append
// goes through it, whether it holds the shard in memory or streams it
// into the store (whose append of a shard that hashes wrong commits
// nothing), so that a shard too large to be held is read again on the
// spot too, not after the task's retry and its back-off.
func readIntact(job AppendJob, read func() error) error {
	var sums []string
	for {
		err := read()
		var he *tokens.HashError
		if !errors.As(err, &he) {
			return err
		}
		sums = append(sums, he.Got)
		if len(sums) < shardReads {
			continue
		}
		if slices.Sort(sums); len(slices.Compact(sums)) > 1 {
			// Changed on the way, differently each time: the task's next
			// try reads it again.
			return err
		}
		return &PresetError{fmt.Errorf("append shard %q to token store %s: its object %s, read %d times, hashed each time to sha256 %s, not the %s it was made with: the stored shard is not the one its shard step made (or something between here and object storage changes it the same way each time); enqueue the ingest again ('sched enqueue ingest'), which makes it again",
			job.ShardID, job.Store, job.Object, len(sums), he.Got, he.Want)}
	}
}

// shardReads is how many times readIntact reads a shard whose tokens do
// not hash to what was made before it takes the stored object as changed.
const shardReads = 3

// prefetchOnce is one read of prefetch's.
func (p *Pipeline) prefetchOnce(ctx context.Context, dir string, job AppendJob, progress func(done, total int64)) (*prefetched, error) {
	limit := p.Prefetch
	if limit == 0 {
		limit = DefaultPrefetch
	}
	size := job.Tokens * int64(tokens.DtypeFor(job.Tokenizer.VocabSize).Width())
	if size <= 0 || size > limit {
		return nil, nil
	}
	if m := p.manifest(dir); m != nil && m.Input(job.ShardID).Whole {
		return nil, nil // a retry of a committed append: its object may be gone
	}
	body, err := p.getShard(ctx, job)
	var missing *MissingShardError
	if errors.As(err, &missing) {
		// Appended and deleted by another worker since the manifest was
		// read, or lost: the append decides which, holding the store.
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer body.Close()
	buf := bytes.NewBuffer(make([]byte, 0, size+bytes.MinRead)) // room for the read that finds EOF
	if _, err := buf.ReadFrom(&countingReader{r: body, total: size, progress: progress}); err != nil {
		return nil, fmt.Errorf("reading shard %s: %w", job.Object, err)
	}
	checked, err := tokens.CheckShard(dir, job.shardInfo(), job.Tokenizer, buf.Bytes())
	if err != nil {
		return nil, err
	}
	return &prefetched{data: buf.Bytes(), checked: checked}, nil
}

// shardInfo is what the store records of all of the job's shard, which
// holds its file from its first record read (the rest of the file), or
// all of it, and the documents it left out with it.
func (job AppendJob) shardInfo() tokens.ShardInfo {
	part := tokens.Part{From: job.from()}
	return tokens.ShardInfo{ID: job.ShardID, Source: job.Source, Revision: job.Revision, SHA256: job.SHA256, Part: part,
		Skipped: skipRecords(tokens.Skipped{ID: job.ShardID, Source: job.Source, Revision: job.Revision, From: part.From}, job.Skipped)}
}

// sum is the SHA-256 the job's shard was made with, for a read of it
// that the store in storesDir appends from.
func (job AppendJob) sum(storesDir string) shardSum {
	return shardSum{dir: filepath.Join(storesDir, job.Store), id: job.ShardID, want: job.SHA256}
}

// getShard opens the job's shard object: none for a shard of no tokens.
func (p *Pipeline) getShard(ctx context.Context, job AppendJob) (io.ReadCloser, error) {
	if job.Object == "" {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	r, err := p.Objects.Get(ctx, job.Object)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &MissingShardError{Store: job.Store, ShardID: job.ShardID, Object: job.Object}
	}
	if err != nil {
		return nil, fmt.Errorf("reading shard %s: %w", job.Object, err)
	}
	return r, nil
}

// storeLocks serialises this process's appends to one store directory:
// the store's file lock refuses a second appender of this process at once
// (it waits, as StoreWait says, only for another process), which would
// fail the second of two append tasks of one worker.
var storeLocks sync.Map // store directory -> *sync.Mutex

func lockStoreHere(dir string) (unlock func()) {
	m, _ := storeLocks.LoadOrStore(dir, new(sync.Mutex))
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// countingReader reports how much of a shard has been read.
type countingReader struct {
	r        io.Reader
	n, total int64
	progress func(done, total int64)
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.progress != nil && n > 0 {
		c.progress(c.n, c.total)
	}
	return n, err
}
