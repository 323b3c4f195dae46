package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/tokenizer"
)

// series reads one series' value from a Prometheus text page, -1 when it
// is absent.
func series(page, name string, labels ...string) float64 {
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

// A worker started with --metrics-addr serves Prometheus's text format, and
// its series follow an ingest and a training run through real Redis: the
// store's done files and tokens appear as the ingest appends, the run's
// series appear when it trains and reach its last step, and the queues'
// completed counts and the run's done flag say when both are over.
func TestWorkerMetricsFollowIngestAndTraining(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	home := t.TempDir()
	data := filepath.Join(home, "data")
	corpus := filepath.Join(runtime.GOROOT(), "src", "strings")
	runsFile := filepath.Join(home, "runs.yaml")
	if err := os.WriteFile(runsFile, []byte(`m:
  from: demo
  tokenizer: code-300
  mixture: [{store: code, weight: 1}]
  seq: 32
  batch: 2
  total_steps: 60
  eval_every: 0
  checkpoint_every: 20
  log_every: 1
  engine: cpu
`), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + corpus, "KILN_TOKENIZER=code-300",
		"KILN_RUNS=" + runsFile, "KILN_LOG_FORMAT=json"}
	tj, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(strings.Repeat("func (b *Builder) String() string { return b.s }\n", 200))},
		tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	putObject(t, data, "tokenizers/code-300/tokenizer.json", tj)

	// One worker tokenizes (and serves the metrics); the appends and the
	// training wait for a second, started once the ingest's lag shows.
	w := &dayWorker{t: t, env: append(baseEnv(t), env...), args: []string{"--queues", "ingest=1", "--metrics-addr", "127.0.0.1:0"}}
	w.start()
	var url string
	deadline := time.Now().Add(time.Minute)
	for url == "" {
		if m := regexp.MustCompile(`"url":"(http://[^"]+/metrics)"`).FindStringSubmatch(w.log()); m != nil {
			url = m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("the worker did not open its metrics endpoint within a minute:\n%s", w.log())
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	scrape := func() string {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
		}
		return string(b)
	}
	waitSeries := func(what string, cond func(page string) bool) string {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			page := scrape()
			if cond(page) {
				return page
			}
			if time.Now().After(deadline) {
				t.Fatalf("metrics never showed %s; last page:\n%s\nworker log:\n%s", what, page, w.log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The endpoint opens before the worker's first heartbeat lands.
	page := waitSeries("the worker's heartbeat", func(p string) bool { return series(p, "kiln_workers") >= 1 })
	if series(page, "kiln_scrape_error") != 0 || series(page, "go_goroutines") <= 0 {
		t.Fatalf("a scrape error, or no runtime metrics:\n%s", page)
	}

	if out, errOut, code := sched(t, env, "enqueue", "ingest", "local:"+filepath.Join(corpus, "*.go"), "--store", "code"); code != 0 {
		t.Fatalf("enqueue ingest: exit %d %s%s", code, out, errOut)
	}
	waitSeries("shards waiting for their append", func(p string) bool { return series(p, "kiln_ingest_append_lag", `store="code"`) > 0 })
	(&dayWorker{t: t, env: append(baseEnv(t), env...), args: []string{"--queues", "append=1,gpu=1"}}).start()
	page = waitSeries("the ingest done", func(p string) bool {
		done := series(p, "kiln_ingest_files", `store="code"`, `state="done"`)
		return done > 0 && series(p, "kiln_ingest_files", `store="code"`, `state="waiting"`) == 0 &&
			series(p, "kiln_ingest_files", `store="code"`, `state="running"`) == 0
	})
	if series(page, "kiln_ingest_append_lag", `store="code"`) != 0 {
		t.Errorf("after the ingest: append lag %v, want 0:\n%s", series(page, "kiln_ingest_append_lag", `store="code"`), page)
	}
	if series(page, "kiln_ingest_tokens", `store="code"`) <= 0 || series(page, "asynq_tasks_enqueued_total", `queue="append"`, `state="completed"`) <= 0 ||
		series(page, "asynq_tasks_processed_total", `queue="append"`) <= 0 {
		t.Errorf("after the ingest: no tokens or no completed appends:\n%s", page)
	}

	if v := series(page, "kiln_run_step", `run="m"`); v != -1 {
		t.Fatalf("kiln_run_step of a run not yet queued reads %v", v)
	}
	if out, errOut, code := sched(t, env, "enqueue", "train", "m"); code != 0 {
		t.Fatalf("enqueue train: exit %d %s%s", code, out, errOut)
	}
	page = waitSeries("the run done", func(p string) bool { return series(p, "kiln_run_done", `run="m"`) == 1 })
	if last := series(page, "kiln_run_step", `run="m"`); last != 60 {
		t.Errorf("kiln_run_step of the finished run reads %v; want 60", last)
	}
	if series(page, "kiln_run_checkpoint_step", `run="m"`) != 60 || series(page, "kiln_run_loss", `run="m"`) <= 0 ||
		series(page, "kiln_run_tokens", `run="m"`) != 60*2*32 {
		t.Errorf("the finished run's series:\n%s", page)
	}
}
