package main

import (
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
)

// A worker whose KILN_DATASETS file is not valid starts and serves its
// queues: the tasks carry the presets they name, so the workers need no
// copy of the file (README). It refused to start, exit 2, with
// "worker: Handlers.Tokenizers.Presets: ...", a Go field path, in place of
// the variable. `sched config` still refuses the file, naming it.
func TestAWorkerStartsWhereKILN_DATASETSIsNotValid(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "datasets.yaml")
	if err := os.WriteFile(bad, []byte("mine:\n  repo: a/b\n  filez: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir(), "KILN_DATASETS=" + bad}
	w := startWorker(t, env, "--queues", "ingest=1")
	exited := make(chan error, 1)
	go func() { exited <- w.Wait() }()
	// The worker's heartbeat in status, or its exit, whichever comes.
	serving := regexp.MustCompile(`(?m)^\S+  ingest=1  0 running  up `)
	for {
		select {
		case err := <-exited:
			_, errOut, _ := sched(t, env, "config")
			t.Fatalf("the worker ended (%v) where KILN_DATASETS is not valid; want it to start ('sched config' says %q)", err, errOut)
		default:
		}
		if out, _, _ := sched(t, env, "status"); serving.MatchString(out) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Stopped here, so that the one Wait is this test's.
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Errorf("worker on SIGTERM: %v", err)
	}
	wantRefused(t, env, "KILN_DATASETS: "+bad+": not valid preset YAML", "config")
}
