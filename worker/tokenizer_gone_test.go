package worker

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// pausedRun is a run of 4 steps in segments of 2, on a worker in this
// process with object storage on versitygw, whose first segment has
// trained and checkpointed step 2: the segment it queued is held back
// (next), for the test to run once it has changed what the run finds. The
// worker's runs hold another of the same tokenizer, not begun: the run's
// name and "-new".
type pausedRun struct {
	e        *env
	objects  store.Store
	run, tok string
	// dir is the worker's run root, data its data directory.
	dir, data string
	next      scheduler.TrainSegment
}

func trainFirstSegment(t *testing.T, name string) *pausedRun {
	t.Helper()
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	p := &pausedRun{e: newEnv(t), objects: objects, run: name, tok: publishTestTokenizer(t, objects), dir: t.TempDir(), data: t.TempDir()}
	run := patternRun(name, p.tok, 1e-3, 4, 0, 2)
	run.Segment = runs.Segment{MaxSteps: 2}
	fresh := patternRun(name+"-new", p.tok, 1e-3, 4, 0, 2)
	fresh.Segment = runs.Segment{MaxSteps: 2}
	next := make(chan scheduler.Args, 4)
	p.e.handlers.Training = &Training{
		Redis: p.e.rdb, Objects: objects, Runs: runs.Set{name: run, name + "-new": fresh}, Dir: p.dir, DataDir: p.data, Owner: "gpu-test",
		Enqueue:  func(_ context.Context, a scheduler.Args) error { next <- a; return nil },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil },
		Log:      zap.NewNop(),
	}
	p.e.serve(map[string]int{scheduler.QueueGPU: 1})
	p.e.waitFor(p.e.enqueue(scheduler.TrainSegment{Run: name}), time.Minute, "completed", state("completed"))
	a := <-next
	seg, ok := a.(scheduler.TrainSegment)
	if !ok || seg.FromStep != 2 || seg.Tokenizer != p.tok {
		t.Fatalf("the first segment queued %#v; want the segment from step 2 with tokenizer %s", a, p.tok)
	}
	p.next = seg
	return p
}

// get is the object key holds.
func (p *pausedRun) get(t *testing.T, key string) []byte {
	t.Helper()
	r, err := p.objects.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// put replaces what key holds with b.
func (p *pausedRun) put(t *testing.T, key string, b []byte) {
	t.Helper()
	if err := p.objects.Put(context.Background(), key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// deleteTokenizer removes the run's tokenizer from object storage and from
// the worker's data directory, as a person or a bucket's lifecycle rule
// might.
func (p *pausedRun) deleteTokenizer(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	objs, err := p.objects.List(ctx, catalog.Prefix+p.tok+"/")
	if err != nil || len(objs) == 0 {
		t.Fatalf("tokenizer %s in object storage: %v, %v", p.tok, objs, err)
	}
	for _, o := range objs {
		if err := p.objects.Delete(ctx, o.Key); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(filepath.Join(p.data, "tokenizers", p.tok)); err != nil {
		t.Fatal(err)
	}
}

// A run under way whose tokenizer was deleted from object storage and from
// the worker's disk goes on: the segment publishes the tokenizer again,
// under its name, from the copy its newest checkpoint holds, checked
// against the SHA-256 the checkpoint records. It was archived, told to
// train a tokenizer under the name, which would have made another one that
// the run refuses and that a published name never gives way to.
func TestARunWhoseTokenizerIsGonePutsItBackFromItsCheckpoint(t *testing.T) {
	p := trainFirstSegment(t, "tok-gone")
	ctx := context.Background()
	published := p.get(t, catalog.Key(p.tok))
	sums := p.get(t, catalog.SumsKey(p.tok))
	p.deleteTokenizer(t)
	// This disk's copy of the checkpoint goes too: the copy put back is
	// object storage's.
	if err := os.RemoveAll(segment.RunDir(p.dir, p.run)); err != nil {
		t.Fatal(err)
	}

	id := p.e.enqueue(p.next)
	ts := p.e.waitFor(id, time.Minute, "completed or archived", func(ts scheduler.TaskStatus) bool {
		return ts.State == "completed" || ts.State == "archived"
	})
	if ts.State != "completed" || ts.Retried != 0 {
		t.Fatalf("the segment after the tokenizer was deleted: %s, retried %d, %q; want it completed", ts.State, ts.Retried, ts.LastErr)
	}
	if st := p.e.rdb.HGetAll(ctx, scheduler.RunStateKey(p.run)).Val(); st["step"] != "4" || st["done"] != "true" {
		t.Errorf("run state %v; want the run trained on to step 4", st)
	}
	if got := p.get(t, catalog.Key(p.tok)); !bytes.Equal(got, published) {
		t.Errorf("%s put back with other bytes (%d, was %d)", catalog.Key(p.tok), len(got), len(published))
	}
	if got := p.get(t, catalog.SumsKey(p.tok)); !bytes.Equal(got, sums) {
		t.Errorf("%s put back as %q; want %q, as it was published", catalog.SumsKey(p.tok), got, sums)
	}
	if local, err := os.ReadFile(filepath.Join(p.data, "tokenizers", p.tok, catalog.FileName)); err != nil || !bytes.Equal(local, published) {
		t.Errorf("this worker's copy of the tokenizer: %v; want it put back too", err)
	}
}

// Where no checkpoint holds a copy that matches what it records (the one
// in object storage altered, none on this disk), the segment is archived
// saying how to put the tokenizer back by hand, and not to train one under
// its name.
func TestARunWhoseTokenizerAndItsCopiesAreGoneSaysHowToPutItBack(t *testing.T) {
	p := trainFirstSegment(t, "tok-lost")
	p.deleteTokenizer(t)
	key := segment.CheckpointPrefix(p.run) + trainer.StepDir(2) + "/" + trainer.TokenizerFile
	altered := p.get(t, key)
	altered[len(altered)/2] ^= 1
	p.put(t, key, altered)
	if err := os.RemoveAll(segment.RunDir(p.dir, p.run)); err != nil {
		t.Fatal(err)
	}

	id := p.e.enqueue(p.next)
	ts := p.e.waitFor(id, time.Minute, "archived", state("archived"))
	for _, want := range []string{
		"run tok-lost trained with",
		"put back " + catalog.Key(p.tok) + ", and beside it its SHA256SUMS",
		"checkpoints/tok-lost/step-NNNNNNN/tokenizer.json",
		"then 'sched enqueue train tok-lost'",
		"a tokenizer trained again under this name is another, which the run refuses",
	} {
		if !strings.Contains(ts.LastErr, want) {
			t.Errorf("archived with %q; want it to say %q", ts.LastErr, want)
		}
	}
	if strings.Contains(ts.LastErr, "sched enqueue tokenizer") || ts.Retried != 0 {
		t.Errorf("archived after %d retries with %q; want it at once, not told to train a tokenizer under the name", ts.Retried, ts.LastErr)
	}
	if _, err := p.objects.Stat(context.Background(), catalog.Key(p.tok)); err == nil {
		t.Errorf("a copy that does not match its checkpoint's record was put back as %s", catalog.Key(p.tok))
	}
}

// A run not begun whose tokenizer was deleted from object storage and
// from the worker's disk, while another run's checkpoint holds it, trains:
// the segment puts the tokenizer back from that copy, the bytes first
// published. It was archived saying to train one with 'sched enqueue
// tokenizer', which makes another that the run under way refuses.
func TestARunNotBegunPutsBackItsDeletedTokenizerFromAnotherRunsCheckpoint(t *testing.T) {
	p := trainFirstSegment(t, "tok-other")
	published := p.get(t, catalog.Key(p.tok))
	p.deleteTokenizer(t)
	id := p.e.enqueue(scheduler.TrainSegment{Run: p.run + "-new"})
	ts := p.e.waitFor(id, time.Minute, "completed", state("completed"))
	if ts.Retried != 0 {
		t.Errorf("the segment of the run not begun took %d retries", ts.Retried)
	}
	if got := p.get(t, catalog.Key(p.tok)); !bytes.Equal(got, published) {
		t.Errorf("tokenizer %s put back as %d bytes, not the %d first published", p.tok, len(got), len(published))
	}
}

// A segment's error that names its run is not prefixed with the run's name
// again: it read "run he: run he: no checkpoint of it in object storage
// downloaded intact ...".
func TestASegmentsErrorNamesItsRunOnce(t *testing.T) {
	p := trainFirstSegment(t, "named-once")
	key := segment.CheckpointPrefix(p.run) + trainer.StepDir(2) + "/" + trainer.ModelFile
	altered := p.get(t, key)
	altered[len(altered)-1] ^= 1
	p.put(t, key, altered)
	if err := os.RemoveAll(segment.RunDir(p.dir, p.run)); err != nil {
		t.Fatal(err)
	}

	id := p.e.enqueue(p.next)
	ts := p.e.waitFor(id, 2*time.Minute, "archived", state("archived"))
	if !strings.HasPrefix(ts.LastErr, "train:segment: run named-once: no checkpoint of it in object storage downloaded intact") ||
		strings.Contains(ts.LastErr, "run named-once: run named-once") {
		t.Fatalf("archived with %q; want it to name the run once, then say no checkpoint downloaded intact", ts.LastErr)
	}
}

// Where object storage holds none of the run's checkpoints (their uploads
// refused, or deleted), the copy put back is the one of the newest
// checkpoint on this worker's disk.
func TestARunWhoseTokenizerIsGonePutsItBackFromThisDisk(t *testing.T) {
	p := trainFirstSegment(t, "tok-here")
	ctx := context.Background()
	published := p.get(t, catalog.Key(p.tok))
	p.deleteTokenizer(t)
	objs, err := p.objects.List(ctx, segment.CheckpointPrefix(p.run))
	if err != nil || len(objs) == 0 {
		t.Fatalf("the run's checkpoints in object storage: %v, %v", objs, err)
	}
	for _, o := range objs {
		if err := p.objects.Delete(ctx, o.Key); err != nil {
			t.Fatal(err)
		}
	}

	id := p.e.enqueue(p.next)
	ts := p.e.waitFor(id, time.Minute, "completed or archived", func(ts scheduler.TaskStatus) bool {
		return ts.State == "completed" || ts.State == "archived"
	})
	if ts.State != "completed" {
		t.Fatalf("the segment after the tokenizer was deleted: %s, %q; want it completed", ts.State, ts.LastErr)
	}
	if got := p.get(t, catalog.Key(p.tok)); !bytes.Equal(got, published) {
		t.Errorf("%s put back with other bytes (%d, was %d)", catalog.Key(p.tok), len(got), len(published))
	}
}

// A segment given a tokenizer name nothing holds, for a run whose
// checkpoints were trained with another, is archived saying which: the
// copy they hold is not published under a name they do not record.
func TestARunGivenAnUnknownTokenizerIsToldTheOneItTrainedWith(t *testing.T) {
	p := trainFirstSegment(t, "tok-other")
	seg := p.next
	seg.Tokenizer = "never-published"
	id := p.e.enqueue(seg)
	ts := p.e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, `tokenizer "never-published" is in neither object storage nor`) ||
		!strings.Contains(ts.LastErr, "run tok-other's checkpoints were trained with tokenizer "+p.tok) ||
		!strings.Contains(ts.LastErr, "give the run the tokenizer it was trained with") || strings.Contains(ts.LastErr, "sched enqueue tokenizer") {
		t.Fatalf("archived with %q; want it to name the tokenizer the run trained with", ts.LastErr)
	}
	if _, err := p.objects.Stat(context.Background(), catalog.Key("never-published")); err == nil {
		t.Errorf("the run's tokenizer was published under a name its checkpoints do not record")
	}
}
