package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// sched ingest --direct --revision at a commit the hub does not have (one
// a force-push replaced) is refused naming --revision, the setting the
// user typed, as the queued ingest is; it used to send them to the
// preset's revision, which says "main". Without --revision, a preset that
// names a gone commit names the preset's revision. Nothing is stored.
func TestADirectIngestAtAGoneRevisionNamesTheFlag(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Add("org/data", "data/a.jsonl", []byte(`{"text":"package main"}`+"\n"), false)
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	const gone = "0123456789abcdef0123456789abcdef01234567"
	presets := filepath.Join(dir, "presets.yaml")
	os.WriteFile(presets, []byte("mine:\n  repo: org/data\n  revision: main\n  include: [\"data/*.jsonl\"]\n"+
		"pinned:\n  repo: org/data\n  revision: "+gone+"\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	env := []string{"HF_ENDPOINT=" + hub.Server.URL, "KILN_DATA_DIR=" + filepath.Join(dir, "data")}
	store := filepath.Join(dir, "stores", "code")
	wantRefused(t, env, "dataset org/data has no revision "+gone+", which --revision names (RevisionNotFound): set --revision to a branch",
		"ingest", "mine", "--presets", presets, "--direct", "--revision", gone, "--store-dir", store, "--tokenizer-file", tok)
	wantRefused(t, env, "check the revision in the preset",
		"ingest", "pinned", "--presets", presets, "--direct", "--store-dir", store, "--tokenizer-file", tok)
	if entries, err := os.ReadDir(store); err == nil && len(entries) > 0 {
		t.Errorf("the refused ingests left %d entries in the store directory", len(entries))
	}
	out, errOut, code := sched(t, env, "ingest", "mine", "--presets", presets, "--direct", "--revision", hub.Commit, "--store-dir", store, "--tokenizer-file", tok)
	if code != 0 || !strings.Contains(out, "1 appended") {
		t.Errorf("the ingest at the hub's commit: exit %d\n%s%s", code, out, errOut)
	}
}
