package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// HUGGING_FACE_HUB_TOKEN, HF_TOKEN's older name, is the token where
// HF_TOKEN is unset, and HF_TOKEN wins where both are set.
func TestTheHubTokensOlderNameIsReadWhereHFTokenIsUnset(t *testing.T) {
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "hf_older")
	if name, v := envSetting("HF_TOKEN"); name != "HUGGING_FACE_HUB_TOKEN" || v != "hf_older" {
		t.Fatalf("HF_TOKEN unset: %s=%q; want HUGGING_FACE_HUB_TOKEN's value", name, v)
	}
	t.Setenv("HF_TOKEN", "hf_newer")
	if name, v := envSetting("HF_TOKEN"); name != "HF_TOKEN" || v != "hf_newer" {
		t.Fatalf("both set: %s=%q; want HF_TOKEN's value", name, v)
	}
	t.Setenv("KILN_TOKENIZER", "")
	if name, v := envSetting("KILN_TOKENIZER"); name != "KILN_TOKENIZER" || v != "" {
		t.Fatalf("a setting of no older name, unset: %s=%q", name, v)
	}
}

// sched config shows the token given by its older name, masked, and the
// settings read from the environment alone, each with its value or what
// its absence means.
func TestConfigShowsTheEnvironmentOnlySettings(t *testing.T) {
	t.Parallel()
	runsFile := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(runsFile, []byte("mine:\n  from: pilot\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := sched(t, []string{"HUGGING_FACE_HUB_TOKEN=hf_older_secret", "KILN_RUNS=" + runsFile, "KILN_GPUS=all"}, "config")
	if code != 0 {
		t.Fatalf("sched config: exit %d: %s", code, errOut)
	}
	mirror, errOut, code := sched(t, []string{"HF_ENDPOINT=https://me:mirror_secret@hub.example.org"}, "config")
	if code != 0 || strings.Contains(mirror, "mirror_secret") || !strings.Contains(mirror, "hub.example.org") {
		t.Fatalf("sched config with a mirror's URL holding a password: exit %d: %s%s; want it shown, masked", code, mirror, errOut)
	}
	if code != 0 {
		t.Fatalf("sched config: exit %d: %s", code, errOut)
	}
	if strings.Contains(out, "hf_older_secret") {
		t.Fatalf("sched config shows the hub token:\n%s", out)
	}
	for _, want := range []string{
		"HF_TOKEN             hf-token         ****\n",
		"KILN_RUNS            -                " + runsFile + "\n",
		"KILN_GPUS            -                all\n",
		"KILN_DATASETS        -                (unset: the preset datasets only)\n",
		"KILN_REQUIRE_GPU     -                (unset: false)\n",
		"HF_ENDPOINT          -                (unset: https://huggingface.co)\n",
		"KILN_NCCL_BUCKET_MB  -                (unset: off, one all-reduce after the backward)\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sched config lacks %q:\n%s", want, out)
		}
	}
}

// A bucket size set is shown as given; one the engine would refuse stops
// every command, sched config too, naming the variable and the sizes.
func TestConfigShowsTheBucketSize(t *testing.T) {
	t.Parallel()
	out, errOut, code := sched(t, []string{"KILN_NCCL_BUCKET_MB=25"}, "config")
	if code != 0 || !strings.Contains(out, "KILN_NCCL_BUCKET_MB  -                25\n") {
		t.Fatalf("KILN_NCCL_BUCKET_MB=25 sched config: exit %d: %s%s", code, out, errOut)
	}
	_, errOut, code = sched(t, []string{"KILN_NCCL_BUCKET_MB=25MB"}, "config")
	if code != 2 || !strings.Contains(errOut, "KILN_NCCL_BUCKET_MB") || !strings.Contains(errOut, "from 1 to 1024") {
		t.Fatalf("KILN_NCCL_BUCKET_MB=25MB sched config: exit %d, %q; want exit 2 naming the variable and the sizes", code, errOut)
	}
}

// A KILN_GPUS or KILN_REQUIRE_GPU the GPU worker would refuse at its start
// is refused by sched config too, after the settings are printed.
func TestConfigRefusesTheWorkersBadGPUSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ env, want string }{
		{"KILN_GPUS=abc", `KILN_GPUS "abc": give a number of GPUs (1 or more), or all`},
		{"KILN_REQUIRE_GPU=maybe", `KILN_REQUIRE_GPU "maybe" is not true or false: write true, yes, on or 1, or false, no, off or 0 (in any case), or leave it unset`},
	} {
		out, errOut, code := sched(t, []string{c.env}, "config")
		if code != 2 || !strings.Contains(errOut, c.want) || !strings.Contains(out, "KILN_REDIS_URL") {
			t.Errorf("%s sched config: exit %d, %q; want the settings printed, then exit 2 and %q", c.env, code, errOut, c.want)
		}
	}
}

// An HF_ENDPOINT, KILN_RUNS or KILN_DATASETS that the commands reading it
// would refuse (an ingest, sched enqueue train, a worker at its start) is
// refused by sched config too, after the settings are printed, in one line
// that names the variable and what to do.
func TestConfigRefusesWhatTheCommandsReadingTheEnvironmentWould(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.yaml")
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte("mine: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ env, want string }{
		{"HF_ENDPOINT=huggingface.co", `hub endpoint "huggingface.co" (HF_ENDPOINT) is not an http(s) URL: set it to a base URL such as https://huggingface.co`},
		{"HF_ENDPOINT=https://me:mirror_secret@hub example.org", `(HF_ENDPOINT) is not an http(s) URL`},
		{"KILN_RUNS=" + missing, "KILN_RUNS: runs file: open " + missing + ": no such file or directory; fix the file or its path, or unset KILN_RUNS for the preset runs alone"},
		{"KILN_RUNS=" + broken, "KILN_RUNS: runs file " + broken + ": YAML syntax near line 1"},
		{"KILN_DATASETS=" + missing, "KILN_DATASETS: reading dataset presets " + missing + ": open " + missing + ": no such file or directory"},
		{"KILN_DATASETS=" + broken, "KILN_DATASETS: " + broken + ": not valid preset YAML: YAML syntax near line 1"},
	} {
		out, errOut, code := sched(t, []string{c.env}, "config")
		if code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, c.want) || !strings.Contains(out, "KILN_REDIS_URL") {
			t.Errorf("%s sched config: exit %d, %q; want the settings printed, then exit 2 and one line containing %q", c.env, code, errOut, c.want)
		}
		if strings.Contains(out+errOut, "mirror_secret") {
			t.Errorf("%s sched config shows the mirror's password:\n%s%s", c.env, out, errOut)
		}
	}
}

// Every command that reads KILN_RUNS's file refuses one it cannot read as
// sched config does, naming the file and what to do; and a run in it that
// reads but could never train, naming the file and the fix, where
// `sched enqueue train` said only "run r1: batch must be at least 1" and
// the other commands "KILN_RUNS: runs file: open ...", with nothing to do.
// Nothing is queued.
func TestEveryCommandReadingKILN_RUNSSaysWhatToDo(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("r1:\n  from: pilot-cpu\n  batch: -2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	unread := "sched: KILN_RUNS: runs file: open " + missing + ": no such file or directory; fix the file or its path, or unset KILN_RUNS for the preset runs alone\n"
	for _, args := range [][]string{{"enqueue", "train", "pilot-cpu"}, {"enqueue", "bench", "pilot-cpu"}, {"runs", "--presets"}, {"config"}} {
		_, errOut, code := sched(t, append(base, "KILN_RUNS="+missing), args...)
		if code != 2 || !strings.HasSuffix(errOut, unread) {
			t.Errorf("KILN_RUNS=%s sched %s: exit %d, %q; want exit 2 and\n%q", missing, strings.Join(args, " "), code, errOut, unread)
		}
	}
	invalid := "sched: KILN_RUNS " + bad + ": run r1: batch must be at least 1, got -2; fix the run in the file ('sched runs --presets' lists every run and whether it is valid)\n"
	for _, args := range [][]string{{"enqueue", "train", "r1"}, {"enqueue", "bench", "r1"}, {"config"}} {
		_, errOut, code := sched(t, append(base, "KILN_RUNS="+bad), args...)
		if code != 2 || !strings.HasSuffix(errOut, invalid) {
			t.Errorf("KILN_RUNS=%s sched %s: exit %d, %q; want exit 2 and\n%q", bad, strings.Join(args, " "), code, errOut, invalid)
		}
	}
	opt, err := redis.ParseURL(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	if n, err := rdb.DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Errorf("refused commands left %d keys in Redis (%v)", n, err)
	}
}
