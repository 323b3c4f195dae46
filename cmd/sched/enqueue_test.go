package main

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// queuedSegment enqueues `sched enqueue train <args>` and returns the
// payload the GPU worker will decode.
func queuedSegment(t *testing.T, env []string, url string, args ...string) scheduler.TrainSegment {
	t.Helper()
	out, errOut, code := sched(t, env, append([]string{"enqueue", "train"}, args...)...)
	m := regexp.MustCompile(`queued (train:segment:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue train %v: exit %d, %q %q", args, code, out, errOut)
	}
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		t.Fatal(err)
	}
	in := asynq.NewInspector(opt)
	defer in.Close()
	info, err := in.GetTaskInfo(scheduler.QueueGPU, m[1])
	if err != nil {
		t.Fatal(err)
	}
	var env1 struct {
		Args scheduler.TrainSegment `json:"args"`
	}
	if err := json.Unmarshal(info.Payload, &env1); err != nil {
		t.Fatalf("payload %q: %v", info.Payload, err)
	}
	return env1.Args
}

// A run's own tokenizer wins over the configured default, so that
// `sched enqueue train pilot` trains on the stores its mixture names; an
// explicit --tokenizer still pins another one.
func TestEnqueueTrainKeepsTheRunsTokenizer(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_TOKENIZER=kiln-bpe"}
	if a := queuedSegment(t, env, r.URL(0), "pilot"); a.Run != "pilot" || a.Tokenizer != "" {
		t.Fatalf("enqueue train pilot queued %+v; want run pilot with no tokenizer override (the runs entry names mix-16384)", a)
	}
	if a := queuedSegment(t, env, r.URL(0), "demo", "--tokenizer", "other"); a.Tokenizer != "other" {
		t.Fatalf("enqueue train demo --tokenizer other queued tokenizer %q; want other", a.Tokenizer)
	}
	_, errOut, code := sched(t, env, "enqueue", "train", "pilott")
	if code != exitBadInput || !regexp.MustCompile(`unknown run "pilott": choose one of .*pilot`).MatchString(errOut) {
		t.Fatalf("enqueue train pilott: exit %d, %q; want exit 2 naming the known runs", code, errOut)
	}
}
