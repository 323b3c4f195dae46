package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/ingest/hub/hubtest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/tokenizer"
)

// A Hub token's refusal names what gave the token: HUGGING_FACE_HUB_TOKEN
// (HF_TOKEN's older name), HF_TOKEN read over it where both are set,
// --hf-token (over a variable also set, or given empty) or hf_token in the
// config file. Each was called HF_TOKEN, so a user with the token of
// another told to change HF_TOKEN changed what is not read.
func TestDatasetsCheckNamesWhatGaveTheHubToken(t *testing.T) {
	t.Parallel()
	h := hubtest.New()
	t.Cleanup(h.Close)
	h.Gated, h.Authorized, h.Revoked = true, "hf_good", "hf_revoked"
	h.Add("org/gated", "data/a.jsonl", []byte(`{"text":"package main"}`+"\n"), false)
	dir := t.TempDir()
	presets := filepath.Join(dir, "presets.yaml")
	if err := os.WriteFile(presets, []byte("gated:\n  repo: org/gated\n  include: [\"data/*.jsonl\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	configWith := func(token string) string {
		p := filepath.Join(t.TempDir(), "kiln.yaml")
		if err := os.WriteFile(p, []byte("hf_token: "+token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badFile, revokedFile := configWith("hf_bad"), configWith("hf_revoked")
	const older = "HUGGING_FACE_HUB_TOKEN (HF_TOKEN's older name, read as HF_TOKEN is unset)"
	page := h.Server.URL + "/datasets/org/gated"
	for _, c := range []struct {
		name  string
		env   []string
		flags []string
		want  string
	}{
		{"the older name alone", []string{"HUGGING_FACE_HUB_TOKEN=hf_bad"}, nil,
			"dataset org/gated is gated and this " + older + " is not in its authorized list: accept its terms at " + page + " with the token's account"},
		{"both variables", []string{"HF_TOKEN=hf_bad", "HUGGING_FACE_HUB_TOKEN=hf_good"}, nil,
			"dataset org/gated is gated and this HF_TOKEN (read over HUGGING_FACE_HUB_TOKEN, also set) is not in its authorized list"},
		{"the flag over a variable", []string{"HF_TOKEN=hf_good"}, []string{"--hf-token", "hf_bad"},
			"dataset org/gated is gated and this --hf-token (read over HF_TOKEN, also set) is not in its authorized list"},
		{"the flag alone", nil, []string{"--hf-token", "hf_bad"},
			"dataset org/gated is gated and this --hf-token is not in its authorized list"},
		{"the config file", nil, []string{"--config", badFile},
			"dataset org/gated is gated and this hf_token in " + badFile + " is not in its authorized list"},
		{"the flag given empty", []string{"HUGGING_FACE_HUB_TOKEN=hf_good"}, []string{"--hf-token", ""},
			"dataset org/gated is gated and --hf-token is given empty, so HUGGING_FACE_HUB_TOKEN is not read: accept its terms at " + page + " and set --hf-token"},
		{"401, the older name", []string{"HUGGING_FACE_HUB_TOKEN=hf_revoked"}, nil,
			"the Hub refused " + older + " for dataset org/gated (401: Invalid credentials in Authorization header): the token is invalid or expired; set HUGGING_FACE_HUB_TOKEN to a token from " + h.Server.URL + "/settings/tokens"},
		{"401, the config file", nil, []string{"--config", revokedFile},
			"the Hub refused hf_token in " + revokedFile + " for dataset org/gated (401: Invalid credentials in Authorization header): the token is invalid or expired; set hf_token in " + revokedFile + " to a token from"},
		{"401, the flag over both variables", []string{"HF_TOKEN=hf_good", "HUGGING_FACE_HUB_TOKEN=hf_good"}, []string{"--hf-token", "hf_revoked"},
			"the Hub refused --hf-token (read over HF_TOKEN, also set) for dataset org/gated (401: Invalid credentials in Authorization header): the token is invalid or expired; set --hf-token to"},
	} {
		env := append([]string{"HF_ENDPOINT=" + h.Server.URL}, c.env...)
		args := append([]string{"datasets", "check", "gated", "--presets", presets}, c.flags...)
		out, errOut, code := sched(t, env, args...)
		if code != exitBadInput || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d\n%s%s\nwant exit 2 and one line containing %q", c.name, code, out, errOut, c.want)
		}
		for _, token := range []string{"hf_bad", "hf_good", "hf_revoked"} {
			if strings.Contains(errOut, token) {
				t.Errorf("%s: the message shows the token %s: %s", c.name, token, errOut)
			}
		}
	}
}

// A worker's refusals name what gave its token too: a plan queues the
// files of a gated dataset the Hub lists to all, the first shard is
// refused its download for the fine-grained token of
// HUGGING_FACE_HUB_TOKEN, the shard queued behind it ends saying to queue
// the ingest again once that variable may read the dataset, and a plan
// with the token revoked is refused naming it, where each said HF_TOKEN.
func TestAWorkerNamesWhatGaveItsHubToken(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	h := hubtest.New()
	t.Cleanup(h.Close)
	h.Gated, h.PublicListing, h.Authorized, h.FineGrained = true, true, "hf_good", "hf_fine"
	h.Add("org/gated", "data/a.jsonl", []byte(`{"text":"package main"}`+"\n"), false)
	h.Add("org/gated", "data/b.jsonl", []byte(`{"text":"package other"}`+"\n"), false)
	dir := t.TempDir()
	presets := filepath.Join(dir, "presets.yaml")
	if err := os.WriteFile(presets, []byte("gated:\n  repo: org/gated\n  include: [\"data/*.jsonl\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	tj, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("package main\nfunc f() {}\n", 100))}, tokenizer.TrainOptions{VocabSize: 280})
	if err != nil {
		t.Fatal(err)
	}
	putObject(t, data, "tokenizers/code-280/tokenizer.json", tj)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_TOKENIZER=code-280", "KILN_LOG_FORMAT=json",
		"KILN_DATASETS=" + presets, "HF_ENDPOINT=" + h.Server.URL, "HUGGING_FACE_HUB_TOKEN=hf_fine"}
	startWorker(t, env, "--queues", "ingest=1,append=1")
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	q := scheduler.NewClient(opt)
	t.Cleanup(func() { q.Close() })
	// archived waits for n tasks of kind to be archived, and returns them.
	archived := func(kind string, n int) []scheduler.TaskStatus {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
			snap, err := q.Snapshot(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			var got []scheduler.TaskStatus
			for _, ts := range snap.Tasks {
				if ts.Kind == kind && ts.State == "archived" {
					got = append(got, ts)
				}
			}
			if len(got) >= n {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d %s tasks archived within 2 minutes: %+v", len(got), n, kind, snap.Tasks)
			}
		}
	}
	enqueue := func() {
		t.Helper()
		if out, errOut, code := sched(t, env, "enqueue", "ingest", "gated", "--store", "g"); code != 0 {
			t.Fatalf("enqueue ingest: exit %d\n%s%s", code, out, errOut)
		}
	}

	enqueue()
	const older = "HUGGING_FACE_HUB_TOKEN (HF_TOKEN's older name, read as HF_TOKEN is unset)"
	shards := archived(scheduler.KindIngestShard, 2)
	downloaded := h.Downloads(0)
	behind := 0
	for _, ts := range shards {
		a, _ := scheduler.DecodeTask[scheduler.IngestShard](ts.Payload)
		want := "the Hub refused " + older + " for dataset org/gated (403: "
		if downloaded[a.Path] == 0 {
			behind++
			want = a.Path + " was not downloaded (another file of the plan into token store g was refused): 'sched enqueue ingest' again once HUGGING_FACE_HUB_TOKEN may read the dataset plans it again"
		}
		if !strings.Contains(ts.LastErr, want) || !strings.Contains(ts.LastErr, "else set HUGGING_FACE_HUB_TOKEN to a token of an account that may read") {
			t.Errorf("shard of %s: %q; want it to hold %q and say to set HUGGING_FACE_HUB_TOKEN", a.Path, ts.LastErr, want)
		}
	}
	if behind != 1 {
		t.Errorf("%d shards ended without their download, want 1 (the Hub was asked for %v)", behind, downloaded)
	}

	h.Revoke("hf_fine")
	enqueue()
	plans := archived(scheduler.KindIngestPlan, 1)
	want := "the Hub refused " + older + " for dataset org/gated (401: Invalid credentials in Authorization header): the token is invalid or expired; set HUGGING_FACE_HUB_TOKEN to a token from " + h.Server.URL + "/settings/tokens"
	if !strings.Contains(plans[0].LastErr, want) {
		t.Errorf("the plan with the token revoked: %q; want it to hold %q", plans[0].LastErr, want)
	}
}
