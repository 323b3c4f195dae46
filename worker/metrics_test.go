package worker

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// gaugeOf reads the value of name{run="run"} from a Prometheus text page;
// ok is false where the page has no such series.
func gaugeOf(page, name, run string) (v float64, ok bool) {
	prefix := name + `{run="` + run + `"} `
	for _, line := range strings.Split(page, "\n") {
		if strings.HasPrefix(line, prefix) {
			v, err := strconv.ParseFloat(strings.TrimPrefix(line, prefix), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// The metrics give when each run last reported, from the state its
// segments write, so that an alert can tell a run that stopped reporting.
// A run no segment of which runs keeps the rate of its last logged
// interval (the hang a zero rate tells is a running segment's, which
// cmd/sched's tests stop), and so does a done run; a state that records
// no time gives none, where 0 would read as 1970.
func TestMetricsSayWhenEachRunLastReported(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	q := scheduler.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	t.Cleanup(func() { q.Close() })

	old := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
	for run, fields := range map[string][]any{
		// As a segment writes its state at a logged step, an hour ago.
		"stopped": {"step", "600", "total", "20000", "tokens", "153600", "loss", "4.5402", "tok_per_s", "13979", "gpus", "1",
			"worker", "gpu-a", "updated", old.Format(time.RFC3339)},
		"done": {"step", "800", "total", "800", "tokens", "204800", "tok_per_s", "14100", "done", "true",
			"worker", "gpu-a", "updated", old.Format(time.RFC3339)},
		"untimed": {"step", "10", "total", "100", "tok_per_s", "900"},
	} {
		if err := rdb.HSet(ctx, scheduler.RunStateKey(run), fields...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := ServeMetrics(ctx, "127.0.0.1:0", NewMetrics(q, asynq.RedisClientOpt{Addr: r.Addr}, nil))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	page := string(b)

	for run, rate := range map[string]float64{"stopped": 13979, "done": 14100, "untimed": 900} {
		if v, ok := gaugeOf(page, "kiln_run_tokens_per_second", run); !ok || v != rate {
			t.Errorf("kiln_run_tokens_per_second of run %s: %v (%v), want %v", run, v, ok, rate)
		}
	}
	for _, run := range []string{"stopped", "done"} {
		if v, ok := gaugeOf(page, "kiln_run_last_report_timestamp_seconds", run); !ok || v != float64(old.Unix()) {
			t.Errorf("kiln_run_last_report_timestamp_seconds of run %s: %v (%v), want %d", run, v, ok, old.Unix())
		}
	}
	if v, ok := gaugeOf(page, "kiln_run_last_report_timestamp_seconds", "untimed"); ok {
		t.Errorf("kiln_run_last_report_timestamp_seconds of a state that records no time: %v, want none", v)
	}
	if !strings.Contains(page, "\nkiln_scrape_error 0\n") {
		t.Errorf("the scrape did not read Redis:\n%s", page)
	}
}

// A scrape whose read of every task runs out of time (a week of a large
// ingest's tasks kept in Redis) still gives the runs' figures, which the
// alerts read, and says it failed: the runs' read waited behind it and
// ran out with it, and every kiln_run_* series dropped out.
func TestAScrapeWhoseIngestReadRunsOutKeepsTheRunsFigures(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	q := scheduler.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	t.Cleanup(func() { q.Close() })
	if err := rdb.HSet(ctx, scheduler.RunStateKey("pilot"), "step", "600", "total", "20000", "tok_per_s", "13979").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Enqueue(ctx, scheduler.IngestPlan{Dataset: "local:/src/*.go", Store: "code", Tokenizer: "tk"}); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(q, asynq.RedisClientOpt{Addr: r.Addr}, nil)
	m.IngestWithin = time.Nanosecond // out of time before its first read
	addr, err := ServeMetrics(ctx, "127.0.0.1:0", m)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	page := string(b)
	if v, ok := gaugeOf(page, "kiln_run_step", "pilot"); !ok || v != 600 {
		t.Errorf("kiln_run_step of run pilot: %v (%v), want 600:\n%s", v, ok, page)
	}
	if v, ok := gaugeOf(page, "kiln_run_tokens_per_second", "pilot"); !ok || v != 13979 {
		t.Errorf("kiln_run_tokens_per_second of run pilot: %v (%v), want 13979", v, ok)
	}
	if !strings.Contains(page, "\nkiln_scrape_error 1\n") || strings.Contains(page, "kiln_ingest_files{") {
		t.Errorf("want kiln_scrape_error 1 and no ingest figures:\n%s", page)
	}
}
