package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
)

// sched ingest --direct of a hub dataset, with an HF_ENDPOINT that nothing
// listens at, exits 2 at once with one line naming HF_ENDPOINT, as sched
// datasets check does, and an HF_ENDPOINT with a path too many names
// HF_ENDPOINT rather than the dataset. Nothing is stored.
func TestADirectIngestAtAHubNotReachedNamesHFEndpoint(t *testing.T) {
	t.Parallel()
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Add("org/data", "data/a.jsonl", []byte(`{"text":"package main"}`+"\n"), false)
	dir := t.TempDir()
	tok := goldenTokenizerWithEOS(t, dir)
	presets := filepath.Join(dir, "presets.yaml")
	os.WriteFile(presets, []byte("mine:\n  repo: org/data\n  include: [\"data/*.jsonl\"]\n"), 0o644)
	store := filepath.Join(dir, "stores", "code")
	addr := refusingHubAddr(t)
	env := []string{"HF_ENDPOINT=http://" + addr, "KILN_DATA_DIR=" + filepath.Join(dir, "data")}
	wantRefused(t, env, "connection refused: the Hub at HF_ENDPOINT http://"+addr+" is not reached from here; check this machine's network and proxy, or set HF_ENDPOINT",
		"ingest", "mine", "--presets", presets, "--direct", "--store-dir", store, "--tokenizer-file", tok)
	env[0] = "HF_ENDPOINT=" + hub.Server.URL + "/api"
	wantRefused(t, env, "HF_ENDPOINT "+hub.Server.URL+"/api may not be the Hub's address or a mirror's",
		"ingest", "mine", "--presets", presets, "--direct", "--store-dir", store, "--tokenizer-file", tok)
	if entries, err := os.ReadDir(store); err == nil && len(entries) > 0 {
		t.Errorf("the refused ingests left %d entries in the store directory", len(entries))
	}
	env[0] = "HF_ENDPOINT=" + hub.Server.URL
	if out, errOut, code := sched(t, env, "ingest", "mine", "--presets", presets, "--direct", "--store-dir", store, "--tokenizer-file", tok); code != 0 || !strings.Contains(out, "1 appended") {
		t.Errorf("the ingest at the Hub's address: exit %d\n%s%s", code, out, errOut)
	}
}
