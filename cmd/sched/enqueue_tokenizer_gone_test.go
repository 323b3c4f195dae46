package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/tokens/catalog"
)

// A run with checkpoints whose tokenizer was deleted from object storage
// and from this machine is queued, its tokenizer put back from the copy
// its newest checkpoint holds, checked against what the checkpoint
// records: it was refused and told to make the tokenizer with 'sched
// enqueue tokenizer', which makes another one that the run refuses and
// that a published name never gives way to.
func TestEnqueueTrainPutsBackATokenizerItsCheckpointsHold(t *testing.T) {
	t.Parallel()
	env, rdb, q, objects := s3TrainingSetup(t, "")
	ctx := context.Background()
	was := "tg:\n  from: eta\n  total_steps: 40\n"
	appendRuns(t, env, was)
	trainToTheEnd(t, env, rdb, q, "tg")
	tk := setupTokenizer(t, env)
	local := filepath.Join(envValue(env, "KILN_DATA_DIR"), "tokenizers", "tk", catalog.FileName)
	published := deleteTokenizerTk(t, env, objects)
	editRuns(t, env, was, "tg:\n  from: eta\n  total_steps: 60\n")

	out, errOut, code := sched(t, env, "enqueue", "train", "tg")
	note := "note: tokenizer tk was in neither object storage nor this machine's data directory: put back from checkpoints/tg/step-0000040/tokenizer.json, " +
		"the copy run tg's checkpoint of step 40 holds (sha256 " + tk.SHA256[:12] + ", as that checkpoint records it)"
	if code != 0 || !strings.Contains(out, "the run resumes from its last checkpoint (step 40)") || !strings.Contains(out, note) {
		t.Fatalf("enqueue train tg, its tokenizer deleted: exit %d, %q %q; want it queued from step 40, saying %q", code, out, errOut, note)
	}
	for key, want := range map[string][]byte{
		catalog.Key("tk"):     published,
		catalog.SumsKey("tk"): []byte(tk.SHA256 + "  tokenizer.json\n"),
	} {
		r, err := objects.Get(ctx, key)
		if err != nil {
			t.Fatalf("%s after the enqueue: %v; want it put back", key, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s put back as %d bytes (%v); want %d, as the tokenizer was", key, len(got), err, len(want))
		}
	}
	if got, err := os.ReadFile(local); err != nil || !bytes.Equal(got, published) {
		t.Errorf("this machine's copy of tk: %v; want it put back too", err)
	}
	// Its report is not put back (no checkpoint holds one): said so, not
	// that the queue did not train it.
	if out, errOut, code := sched(t, env, "tokenizers", "tk"); code != 0 || !strings.Contains(out, "put back from a run's checkpoint, which holds no copy of the report") {
		t.Errorf("sched tokenizers tk after it was put back: exit %d, %q %q; want it to say the report was not put back", code, out, errOut)
	}
}
