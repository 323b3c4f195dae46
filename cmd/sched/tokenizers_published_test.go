package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/tokens/catalog"
)

// `sched tokenizers` on a machine other than the one whose disk holds the
// token stores (a host beside the compose stack, another data directory)
// read only its own <data dir>/tokens and said that no store used the
// tokenizer: false, where that decides whether the tokenizer may go. Its
// STORES column reads the statuses the worker that serves append
// publishes in object storage, as 'sched datasets' lists its stores, and
// names a store of this disk once.
func TestTokenizersListsTheStoresOfTheAppendWorkersDisk(t *testing.T) {
	t.Parallel()
	env, _, _, objects := s3TrainingSetup(t, "code")
	ctx := context.Background()
	data := envValue(env, "KILN_DATA_DIR")
	b, err := os.ReadFile(filepath.Join(data, "tokenizers", "tk", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(ctx, catalog.Key("tk"), bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
	startWorker(t, env, "--queues", "append=1")
	waitUntil(t, "the worker's start recording store code in object storage", func() bool {
		st, err := (&ingest.Pipeline{Objects: objects}).Status(ctx, "code")
		return err == nil && st.Tokens > 0 && st.Tokenizer.SHA256 != ""
	})

	line := regexp.MustCompile(`(?m)^tk( \(default\))?  +\d+  +[0-9a-f]{12}  +code  +\S+$`)
	for what, e := range map[string][]string{
		"another data directory":            append(env[:len(env):len(env)], "KILN_DATA_DIR="+t.TempDir()),
		"the append worker's own directory": env,
	} {
		out, errOut, code := sched(t, e, "tokenizers")
		if code != 0 || !line.MatchString(out) || errOut != "" {
			t.Errorf("sched tokenizers from %s: exit %d, stderr %q:\n%s\nwant tk's STORES to read code", what, code, errOut, out)
		}
	}
}
