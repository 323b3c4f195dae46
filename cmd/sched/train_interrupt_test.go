package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sched train stopped by Ctrl-C names the signal, as sched bench and
// sched tokenize do, where it said Go's "context canceled"; it says where
// it stopped and how to go on, and exits 130.
func TestTrainStoppedByASignalNamesIt(t *testing.T) {
	t.Parallel()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	cmd := exec.Command(os.Args[0], "train", "--model", "tiny", "--tokens", store, "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--steps", "100000", "--checkpoint-every", "1", "--out", out, "--tokenizer-file", tokJSON)
	cmd.Env = append(baseEnv(t), "KILN_LOG_FORMAT=json")
	// A checkpoint is written: the stop keeps one.
	code, said := stopAt(t, cmd, `"msg":"checkpoint"`, syscall.SIGINT, nil)
	last := said[strings.LastIndex(strings.TrimSuffix(said, "\n"), "\n")+1:]
	if code != exitInterrupted || !strings.HasPrefix(last, "sched: training stopped (interrupt signal received) at step ") ||
		!strings.Contains(last, "the same command with --resume continues from it") {
		t.Fatalf("exit %d\n%swant exit %d and the last line saying training stopped (interrupt signal received) at a step, and --resume", code, said, exitInterrupted)
	}
}
