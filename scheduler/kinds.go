package scheduler

import (
	"sync"
	"time"

	"github.com/kiln-lm/kiln/ingest"
)

// Queue names. A worker serves some of them (sched worker --queues).
const (
	// QueueIngest is CPU work: any number of consumers on any machine.
	QueueIngest = "ingest"
	// QueueAppend has exactly one consumer: the machine holding the token
	// store, so appends are serialised without a distributed lock.
	QueueAppend = "append"
	// QueueGPU has one consumer with concurrency 1: the GPU worker.
	QueueGPU = "gpu"
)

// Queues lists every queue kiln uses.
var Queues = []string{QueueIngest, QueueAppend, QueueGPU}

// IngestQueues hold every ingest task (plans and shards, appends): what
// Snapshot.Datasets reads.
var IngestQueues = []string{QueueIngest, QueueAppend}

// Task kinds: stable strings stored in Redis with every queued task. Never
// rename one; add the old string to aliases instead, so queued work is not
// orphaned.
const (
	KindIngestPlan      = ingest.KindPlan
	KindIngestShard     = ingest.KindShard
	KindIngestAppend    = ingest.KindAppend
	KindTrainSegment    = "train:segment"
	KindBenchRun        = "bench:run"
	KindTokenizerSample = "tokenizer:sample"
	KindTokenizerTrain  = "tokenizer:train"
)

// Args is a task's typed payload. Each kind has one Go type whose Kind()
// returns its stable kind string.
type Args interface {
	Kind() string
}

// Policy is how one kind is queued and retried.
type Policy struct {
	Queue string
	// Version is the payload version this build writes and reads.
	Version int
	// Timeout bounds one attempt; the handler's context ends then.
	Timeout time.Duration
	// MaxRetry is the number of retries after the first attempt.
	MaxRetry int
	// Backoff is the first retry delay; it doubles per retry up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Retention keeps a finished task (and its id) for `sched runs` and for
	// duplicate detection.
	Retention time.Duration
}

// queueRetries is the MaxRetry a task is queued with: one more than the
// policy's. asynq archives a task at its MaxRetry whatever the error, so
// a task that used its retries and was then interrupted by a shutdown, or
// waits for earlier work, would be archived though it did not fail; the
// worker archives a failure at the policy's MaxRetry itself.
func (p Policy) queueRetries() int { return p.MaxRetry + 1 }

// Retries is how many retries a task of kind gets after failures, queued
// with queued (asynq's MaxRetry): its policy's MaxRetry, which is one
// less than a task is queued with (queueRetries), or queued for a kind
// without a policy.
func Retries(kind string, queued int) int {
	if p, ok := PolicyFor(kind); ok {
		return min(queued, p.MaxRetry)
	}
	return queued
}

const day = 24 * time.Hour

// policies holds every product kind's policy.
var policies = map[string]Policy{
	// Listing a dataset is a few hub requests.
	KindIngestPlan: {Queue: QueueIngest, Version: 2, Timeout: 30 * time.Minute, MaxRetry: 5, Backoff: 30 * time.Second, MaxBackoff: 30 * time.Minute, Retention: 7 * day},
	// A shard is one file, or the rest of one a store took in part:
	// download (hundreds of MB), decode, tokenize.
	KindIngestShard: {Queue: QueueIngest, Version: 3, Timeout: 2 * time.Hour, MaxRetry: 8, Backoff: 30 * time.Second, MaxBackoff: time.Hour, Retention: 7 * day},
	// An append copies one shard file into the store, or the part of it
	// that fits its limit; exactly-once by manifest.
	KindIngestAppend: {Queue: QueueAppend, Version: 3, Timeout: time.Hour, MaxRetry: 10, Backoff: 10 * time.Second, MaxBackoff: 10 * time.Minute, Retention: 7 * day},
	// A training segment runs until its step budget; asynq's default
	// 30-minute timeout would cut it, so its bound only catches a hung GPU.
	// Its commonest failure is a lost worker (SIGKILL, OOM kill, power):
	// asynq hands the task back only once its lease is 30s past expiry,
	// by which time the dead worker's run lock has lapsed too, so every
	// further second of delay is an idle GPU: the first retry comes after
	// seconds. Doubling from there, eight retries span about 20 minutes, so
	// an object-storage or Redis outage is waited out rather than archived;
	// with one consumer per GPU queue and a finite MaxRetry a failing
	// segment cannot turn into a retry storm.
	KindTrainSegment: {Queue: QueueGPU, Version: 1, Timeout: 7 * day, MaxRetry: 8, Backoff: 5 * time.Second, MaxBackoff: 30 * time.Minute, Retention: 30 * day},
	KindBenchRun:     {Queue: QueueGPU, Version: 1, Timeout: 12 * time.Hour, MaxRetry: 1, Backoff: time.Minute, MaxBackoff: 10 * time.Minute, Retention: 30 * day},
	// Sampling reads a dataset slice on CPU.
	KindTokenizerSample: {Queue: QueueIngest, Version: 1, Timeout: 2 * time.Hour, MaxRetry: 5, Backoff: 30 * time.Second, MaxBackoff: 30 * time.Minute, Retention: 7 * day},
	// Training a tokenizer needs the one sample, so it runs where appends do.
	// It runs in the worker's process, whose death (a kill, a restart
	// during the hours it may take) uses a retry as a failure does: four
	// leave room for a few and still end one that kills its worker.
	KindTokenizerTrain: {Queue: QueueAppend, Version: 1, Timeout: 12 * time.Hour, MaxRetry: 4, Backoff: time.Minute, MaxBackoff: 30 * time.Minute, Retention: 30 * day},
}

// aliases maps retired kind strings to current ones.
var aliases = map[string]string{}

// Kinds returns the product kinds, in a stable order.
func Kinds() []string {
	return []string{KindIngestPlan, KindIngestShard, KindIngestAppend, KindTrainSegment, KindBenchRun, KindTokenizerSample, KindTokenizerTrain}
}

// Define adds a kind outside the product set (a test's, say) with its
// policy. It panics if kind is already defined: two meanings for one kind
// string would misroute queued work.
func Define(kind string, p Policy) {
	policiesMu.Lock()
	defer policiesMu.Unlock()
	if _, dup := policies[kind]; dup {
		panic("scheduler: kind " + kind + " defined twice")
	}
	policies[kind] = p
}

var policiesMu sync.RWMutex

// CanonicalKind resolves an alias; ok is false for a kind this build does not know.
func CanonicalKind(kind string) (canonical string, ok bool) {
	if k, ok := aliases[kind]; ok {
		kind = k
	}
	policiesMu.RLock()
	_, ok = policies[kind]
	policiesMu.RUnlock()
	return kind, ok
}

// PolicyFor returns the policy of a product kind.
func PolicyFor(kind string) (Policy, bool) {
	kind, _ = CanonicalKind(kind)
	policiesMu.RLock()
	defer policiesMu.RUnlock()
	p, ok := policies[kind]
	return p, ok
}

func policyOf(a Args) (Policy, bool) { return PolicyFor(a.Kind()) }

// The ingest kinds' payloads are the ingest pipeline's own jobs: a worker
// decodes one and hands it to the pipeline as it is.
type (
	// IngestPlan lists a dataset's files and queues one IngestShard a file.
	IngestPlan = ingest.PlanJob
	// IngestShard tokenizes one file into a shard token file.
	IngestShard = ingest.ShardJob
	// IngestAppend appends one shard to its store, exactly once.
	IngestAppend = ingest.AppendJob
)

// TrainSegment trains a run for a bounded number of steps from its latest
// checkpoint, writes a checkpoint, and enqueues the next segment.
type TrainSegment struct {
	// Run names the run: a preset or an entry of the KILN_RUNS file, which
	// says the model, the data and the schedule. The payload carries no
	// copy of them, so that the worker reads one definition.
	Run string `json:"run"`
	// Tokenizer, when set, overrides the run's tokenizer (sched enqueue
	// train --tokenizer); the worker checks the stores against it.
	Tokenizer string `json:"tokenizer,omitempty"`
	// Engine, when set, overrides the run's engine: cuda, cpu or auto.
	Engine string `json:"engine,omitempty"`
	// FromStep is the checkpoint step this segment resumes from (0: start);
	// it makes each segment's task id distinct.
	FromStep int64 `json:"from_step"`
	// TotalSteps is the run's length when the segment was queued, by the
	// runs entry where it was queued (sched enqueue train's, or the
	// worker's that queued it): `sched status` gives a run queued to go on
	// past its end this length, and a worker whose own entry ends the run
	// where it is done waits for that entry to give it (worker.Training).
	TotalSteps int64 `json:"total_steps,omitempty"`
}

func (TrainSegment) Kind() string { return KindTrainSegment }

// BenchRun measures one model (or one point of a sweep) on the GPU worker.
type BenchRun struct {
	// Sweep names the benchmark sweep; Model the preset or checkpoint.
	Sweep  string            `json:"sweep,omitempty"`
	Model  string            `json:"model,omitempty"`
	Engine string            `json:"engine,omitempty"`
	Params map[string]string `json:"params,omitempty"`
	// GPUs is the run's gpus as its settings write it (a number or all)
	// for `sched enqueue bench RUN`, so that the worker measures on the
	// GPUs the run trains on; empty (and in tasks queued before it was
	// carried): a run that names none, on the worker's KILN_GPUS.
	GPUs string `json:"gpus,omitempty"`
}

func (BenchRun) Kind() string { return KindBenchRun }

// TokenizerSample draws a training sample for a tokenizer from datasets.
type TokenizerSample struct {
	Name     string   `json:"name"`
	Datasets []string `json:"datasets,omitempty"`
	// Bytes is the sample size to draw.
	Bytes int64 `json:"bytes,omitempty"`

	// Dataset is the one dataset this task samples (a preset name or
	// local:<glob>); Bytes is its share of the mixture's sample.
	Dataset string `json:"dataset,omitempty"`
	// Preset is Dataset's preset as the command that queued the task
	// resolved it (ingest.Carried); nil for local:<glob> and in tasks
	// queued before tasks carried it.
	Preset *ingest.Preset `json:"preset,omitempty"`
	// Mixture is every dataset of the tokenizer's sample with its weight:
	// the sampling task that finds all of them drawn queues the training.
	Mixture []TokenizerShare `json:"mixture,omitempty"`
	// TotalBytes is the whole mixture's sample size.
	TotalBytes int64 `json:"total_bytes,omitempty"`
	// Seed chooses the files and the held-out documents.
	Seed uint64 `json:"seed,omitempty"`
	// VocabSize and Previous are passed on to TokenizerTrain.
	VocabSize int    `json:"vocab_size,omitempty"`
	Previous  string `json:"previous,omitempty"`
}

// TokenizerShare is one dataset's weight in a tokenizer's sample.
type TokenizerShare struct {
	Dataset string  `json:"dataset"`
	Weight  float64 `json:"weight"`
}

func (TokenizerSample) Kind() string { return KindTokenizerSample }

// TokenizerTrain trains a byte-level BPE tokenizer and writes
// tokenizers/<Name>/tokenizer.json.
type TokenizerTrain struct {
	Name      string `json:"name"`
	VocabSize int    `json:"vocab_size,omitempty"`
	// Sample is the sample's object key (from TokenizerSample): the prefix
	// holding one text and one held-out file per dataset of Mixture.
	Sample string `json:"sample,omitempty"`

	// Mixture is the datasets sampled, with their weights.
	Mixture []TokenizerShare `json:"mixture,omitempty"`
	// Previous names the tokenizer whose figures the report shows beside
	// the new one's (none when empty or unknown).
	Previous string `json:"previous,omitempty"`
}

func (TokenizerTrain) Kind() string { return KindTokenizerTrain }
