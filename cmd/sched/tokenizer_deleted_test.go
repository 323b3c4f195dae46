package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// deleteTokenizerTk deletes trainingSetup's tokenizer tk from object
// storage and from this machine's data directory, and returns its bytes.
func deleteTokenizerTk(t *testing.T, env []string, objects store.Store) []byte {
	t.Helper()
	ctx := context.Background()
	local := filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "tk", catalog.FileName)
	published, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Dir(local)); err != nil {
		t.Fatal(err)
	}
	objs, err := objects.List(ctx, catalog.Prefix+"tk/")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := objects.Delete(ctx, o.Key); err != nil {
			t.Fatal(err)
		}
	}
	return published
}

// A run not begun whose tokenizer was deleted, while another run's
// checkpoints hold a copy of it that a token store records too, is queued
// with the tokenizer put back from that copy: it was told that the
// tokenizer "does not exist yet" and to make it with 'sched enqueue
// tokenizer', which makes another one that every store and run made with
// the first refuses, and that a published name never gives way to.
func TestEnqueueTrainPutsBackADeletedTokenizerAnotherRunHolds(t *testing.T) {
	t.Parallel()
	env, rdb, q, objects := s3TrainingSetup(t, "")
	tk := setupTokenizer(t, env)
	putStatus(t, objects, "code", ingest.StoreStatus{Tokens: 400_000, Documents: 10, Shards: 1, Done: []string{"s0"}, Tokenizer: tk})
	appendRuns(t, env, "tg:\n  from: eta\n  total_steps: 40\n")
	trainToTheEnd(t, env, rdb, q, "tg")
	published := deleteTokenizerTk(t, env, objects)
	appendRuns(t, env, "tn:\n  from: eta\n  total_steps: 40\n")

	out, errOut, code := sched(t, env, "enqueue", "train", "tn")
	note := "note: tokenizer tk was deleted from object storage and this machine's data directory, but token stores code and runs tg use it (sha256 " + tk.SHA256[:12] +
		"): put back from checkpoints/tg/step-0000040/tokenizer.json, the copy run tg's checkpoint of step 40 holds"
	if code != 0 || !strings.HasPrefix(out, "queued train:segment:") || !strings.Contains(out, note) {
		t.Fatalf("enqueue train tn, its tokenizer deleted: exit %d, %q %q; want it queued, saying %q", code, out, errOut, note)
	}
	r, err := objects.Get(context.Background(), catalog.Key("tk"))
	if err != nil {
		t.Fatalf("tk after the enqueue: %v; want it put back", err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, published) {
		t.Errorf("tk put back as %d bytes (%v); want the %d it was", len(got), err, len(published))
	}
}

// An ingest into a token store made with a tokenizer since deleted, which
// no checkpoint holds a copy of, is refused saying that the tokenizer
// existed, what uses it and how to put it back, where it said it "does not
// exist yet" and to make it with 'sched enqueue tokenizer' (another
// tokenizer, which the store refuses). A name nothing records is still
// one to make.
func TestEnqueueIngestSaysADeletedTokenizerIsToBePutBack(t *testing.T) {
	t.Parallel()
	env, _, _, objects := s3TrainingSetup(t, "")
	tk := setupTokenizer(t, env)
	putStatus(t, objects, "code", ingest.StoreStatus{Tokens: 400_000, Documents: 10, Shards: 1, Done: []string{"s0"}, Tokenizer: tk})
	deleteTokenizerTk(t, env, objects)
	src := filepath.Join(t.TempDir(), "*.go")

	wantBadInput(t, env, `^sched: the ingest uses tokenizer tk, which existed and was deleted from object storage and this machine's data directory: token stores code were made with it \(sha256 `+tk.SHA256[:12]+`\): `+
		regexp.QuoteMeta("put back tokenizers/tk/tokenizer.json, and beside it its SHA256SUMS ('sha256sum tokenizer.json > SHA256SUMS'), from a copy of it with that sha256")+`[^\n]*; a tokenizer trained again under this name is another, which they refuse and which never gives way to this one\n$`,
		"enqueue", "ingest", "local:"+src, "--store", "code", "--tokenizer", "tk")
	_, errOut, _ := sched(t, env, "enqueue", "ingest", "local:"+src, "--store", "code", "--tokenizer", "tk")
	if strings.Contains(errOut, "sched enqueue tokenizer") {
		t.Errorf("the ingest's refusal %q tells to make tokenizer tk again; want it put back", errOut)
	}
	_, errOut, _ = sched(t, env, "enqueue", "ingest", "local:"+src, "--store", "fresh", "--tokenizer", "tnew")
	if !strings.Contains(errOut, "tokenizer tnew, which does not exist yet: make it first with 'sched enqueue tokenizer tnew") {
		t.Errorf("an ingest with a tokenizer nothing records: %q; want it told to make it first", errOut)
	}
}

// 'sched retry' of a segment still queued names its run, as 'sched
// enqueue train' and the other views do, where it named the task's kind
// ("train:segment is already queued as ...").
func TestRetryOfAQueuedSegmentNamesItsRun(t *testing.T) {
	t.Parallel()
	env, _, q, _ := s3TrainingSetup(t, "")
	appendRuns(t, env, "rq:\n  from: eta\n  total_steps: 40\n")
	if out, errOut, code := sched(t, env, "enqueue", "train", "rq"); code != 0 {
		t.Fatalf("enqueue train rq: exit %d: %s%s", code, out, errOut)
	}
	live, err := q.LiveSegment(context.Background(), "rq")
	if err != nil || live == nil {
		t.Fatalf("run rq's segment: %v, %v; want it queued", live, err)
	}
	out, errOut, code := sched(t, env, "retry", live.ID)
	want := "run rq is already queued as " + live.ID + "; nothing queued ('sched status " + live.ID + "' follows it)\n"
	if code != 0 || out != want {
		t.Fatalf("retry %s: exit %d, %q %q; want %q", live.ID, code, out, errOut, want)
	}
}
