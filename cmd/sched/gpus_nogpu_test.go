package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/kernels/cuda"
)

// skipWithAGPU skips a test of what a host without a GPU says: where a GPU
// starts, several GPUs are trained on (or refused for another reason).
func skipWithAGPU(t *testing.T) {
	t.Helper()
	if n := cuda.Devices(); n > 0 {
		t.Skipf("%d GPU(s) here: this tests what a host without a GPU says of several", n)
	}
}

// The remedy a refusal of several GPUs on a host without one ends with.
const onTheCPU = "to train on the CPU set --gpus 1, gpus: 1 in the run (or drop it, with KILN_GPUS=1) or engine cpu, or install the NVIDIA driver"

// On a host without a GPU, engine auto moves a run of one GPU to the CPU
// but archives one of several. sched config --check says so where
// KILN_GPUS asks for several (2, all), rather than that auto takes the
// CPU, and exits 2 naming KILN_GPUS and what to set; KILN_REQUIRE_GPU's
// refusal says why in one short clause and what to do, not the dozen
// paths the CUDA loader tried.
func TestConfigCheckSaysKILNGPUsOfSeveralArchivesAutoWithoutAGPU(t *testing.T) {
	t.Parallel()
	skipWithAGPU(t)
	servers := []string{"KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0"}
	auto := regexp.MustCompile(`(?m)^engine auto +(.*)$`)
	for _, gpus := range []string{"2", "all", "ALL"} {
		out, errOut, code := sched(t, append(servers, "KILN_GPUS="+gpus), "config", "--check")
		m := auto.FindStringSubmatch(out)
		if m == nil || strings.Contains(m[1], "the CPU:") || !strings.Contains(m[1], "archived") {
			t.Errorf("KILN_GPUS=%s, no GPU: engine auto reads %q, want the runs archived, not the CPU:\n%s", gpus, m, out)
		}
		want := "KILN_GPUS is " + strings.ToLower(gpus) + " and no GPU starts here (no NVIDIA driver here (libcuda.so.1 not found)): " +
			"this worker's runs of engine auto that name no gpus would be archived, not moved to the CPU; " +
			"set KILN_GPUS=1 to let them train on the CPU, or install the NVIDIA driver\n"
		if code != exitBadInput || errOut != "sched: "+want {
			t.Errorf("KILN_GPUS=%s, no GPU: exit %d, stderr %q; want exit 2 and %q", gpus, code, errOut, want)
		}
		if !strings.Contains(out, "redis and object store reachable") {
			t.Errorf("KILN_GPUS=%s, no GPU: the servers were left unchecked:\n%s", gpus, out)
		}
	}
	// One GPU asked for: auto takes the CPU, as it says.
	out, errOut, code := sched(t, append(servers, "KILN_GPUS=1"), "config", "--check")
	if m := auto.FindStringSubmatch(out); code != 0 || m == nil || !strings.HasPrefix(m[1], "the CPU: no NVIDIA driver here") {
		t.Errorf("KILN_GPUS=1, no GPU: exit %d, engine auto %q; want 0 and the CPU\n%s%s", code, m, out, errOut)
	}

	_, errOut, code = sched(t, append(servers, "KILN_REQUIRE_GPU=1"), "config", "--check")
	want := "sched: KILN_REQUIRE_GPU is set and no GPU starts here (no NVIDIA driver here (libcuda.so.1 not found)): this worker's runs of engine auto would be archived; " +
		"mend the host (docs/operations.md, \"The GPU worker's host\"), or unset KILN_REQUIRE_GPU to let them train on the CPU\n"
	if code != exitBadInput || errOut != want {
		t.Errorf("KILN_REQUIRE_GPU=1, no GPU: exit %d, stderr %q; want exit 2 and %q", code, errOut, want)
	}
}

// sched train --gpus 2 and sched bench --gpus 2 or all on a host without
// a GPU are refused in one line that names the setting, says why in a few
// words and ends with what to do.
func TestSeveralGPUsWithoutAGPUSayWhatToChange(t *testing.T) {
	t.Parallel()
	skipWithAGPU(t)
	tok, sha := trainTestTokenizer(t, "package main\nfunc f() {}\n")
	store := trainTestStoreBy(t, sha, 280, 50_000)
	for _, args := range [][]string{
		{"train", "--model", "tiny", "--batch", "2", "--seq", "32", "--steps", "2", "--accumulate", "2", "--tokens", store,
			"--tokenizer-file", tok, "--out", t.TempDir(), "--gpus", "2"},
		{"bench", "--model", "tiny", "--batch", "2", "--seq", "32", "--steps", "1", "--warmup", "0", "--gpus", "2"},
		{"bench", "--model", "tiny", "--batch", "2", "--seq", "32", "--steps", "1", "--warmup", "0", "--gpus", "all"},
	} {
		gpus := args[len(args)-1]
		out, errOut, code := sched(t, nil, args...)
		line := strings.TrimSpace(errOut)
		if code != exitBadInput || strings.Contains(line, "\n") || !strings.Contains(line, "gpus "+gpus+" (--gpus, the run's gpus, or the worker's KILN_GPUS where the run names none) and no GPU starts here (no NVIDIA driver here (libcuda.so.1 not found))") ||
			!strings.HasSuffix(line, "; "+onTheCPU) {
			t.Errorf("sched %s: exit %d\n%s%s\nwant exit 2 and one line naming gpus %s, why in short, and ending %q", args[0], code, out, errOut, gpus, onTheCPU)
		}
		if strings.Contains(line, "/usr/local/cuda") {
			t.Errorf("sched %s: the refusal lists the loader's paths: %s", args[0], line)
		}
	}
}

// On a worker of KILN_GPUS=2 without a GPU, the worker's start says that
// its runs of engine auto that name no gpus are archived (not that auto
// trains on the CPU), and such a run, and one that names gpus: 2, are
// archived with a reason whose remedy sched status's FAILURES line keeps
// when it cuts the line.
func TestAWorkerOfSeveralGPUsWithoutAGPUArchivesAutoRunsSayingWhatToDo(t *testing.T) {
	t.Parallel()
	skipWithAGPU(t)
	env, _, _ := trainingSetup(t)
	appendRuns(t, env, "wide:\n  from: eta\n  engine: auto\n  accumulate: 2\n  total_steps: 4\n"+
		"two:\n  from: eta\n  engine: auto\n  accumulate: 2\n  gpus: 2\n  total_steps: 4\n")
	w := startWorker(t, append(env, "KILN_GPUS=2"), "--queues", "gpu=1")
	for _, run := range []string{"wide", "two"} {
		if out, errOut, code := sched(t, env, "enqueue", "train", run); code != 0 {
			t.Fatalf("enqueue train %s: exit %d: %s%s", run, code, out, errOut)
		}
	}
	failures := func(out string) map[string]string {
		lines := map[string]string{}
		_, section, _ := strings.Cut(out, "FAILURES in the last")
		for _, l := range strings.Split(section, "\n") {
			for _, run := range []string{"wide", "two"} {
				if strings.Contains(l, "run "+run+" ") && strings.Contains(l, "failed for good (archived)") {
					lines[run] = l
				}
			}
		}
		return lines
	}
	var lines map[string]string
	waitUntil(t, "both runs archived", func() bool {
		out, _, _ := sched(t, env, "status")
		lines = failures(out)
		return len(lines) == 2
	})
	for run, l := range lines {
		if !strings.HasSuffix(l, "; "+onTheCPU) {
			t.Errorf("run %s's FAILURES line %q; want it to end with the remedy %q", run, l, onTheCPU)
		}
	}
	want := "no GPU starts here (no NVIDIA driver here (libcuda.so.1 not found)) and KILN_GPUS is 2: gpu tasks of engine auto that name no gpus will be archived, not moved to the CPU"
	if log := workerLog(t, w); !strings.Contains(log, want) || strings.Contains(log, "gpu tasks of engine auto train on the CPU") {
		t.Errorf("the worker's log does not say %q, or says that auto trains on the CPU:\n%s", want, log)
	}
}

// A huge gpus, in a runs file or on the command line, is refused in one
// line naming the most one host takes, where it spun counting up to it.
func TestAHugeGPUCountIsRefusedInOneLine(t *testing.T) {
	t.Parallel()
	const huge = "9223372036854775807"
	runsFile := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(runsFile, []byte("big:\n  from: pilot\n  engine: auto\n  gpus: "+huge+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_RUNS=" + runsFile, "KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0"}
	most := "more than one host's GPUs: a run trains on the GPUs of one host, and NCCL joins at most 64 there: give 1 to 64, or all"
	wantRefused(t, env, `gpus "`+huge+`": `+most, "config")
	wantRefused(t, env, `gpus "`+huge+`": `+most, "enqueue", "train", "big")
	wantRefused(t, nil, `--gpus "`+huge+`": `+most, "bench", "--model", "tiny", "--gpus", huge, "--accumulate", "16")
	wantRefused(t, nil, `--gpus "`+huge+`": `+most, "train", "--model", "tiny", "--tokens", t.TempDir(), "--gpus", huge, "--accumulate", "16")
	wantRefused(t, []string{"KILN_GPUS=" + huge}, `KILN_GPUS "`+huge+`": `+most, "config")
}
