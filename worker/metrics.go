package worker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	asynqmetrics "github.com/hibiken/asynq/x/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/scheduler"
)

// Metrics serves kiln's figures in Prometheus's text format at /metrics:
// the queues (asynq's own collector, whose asynq_* names asynqmon's
// metrics view reads), every run's progress (step,
// loss, evaluation loss, tok/s, tokens, last checkpoint and its upload
// time, when it last reported), and every store's ingest (files by state,
// bytes, tokens, rate).
// The figures are read from Redis at each scrape, so every worker serves
// the same cluster-wide view and a scrape costs what `sched status` does;
// scrape every 15 s or more.
type Metrics struct {
	// IngestWithin bounds a scrape's read of the ingest queues' tasks,
	// which the ingest's figures come from; the runs' figures are read first, within
	// 10 s of their own. Default 10s.
	IngestWithin time.Duration
	q            *scheduler.Client
	queues       prometheus.Collector
	log          *zap.Logger
}

// NewMetrics returns the collector reading through q, and asynq's queue
// collector reading through opt.
func NewMetrics(q *scheduler.Client, opt asynq.RedisConnOpt, log *zap.Logger) *Metrics {
	if log == nil {
		log = zap.NewNop()
	}
	return &Metrics{q: q, queues: asynqmetrics.NewQueueMetricsCollector(asynq.NewInspector(opt)), log: log}
}

var (
	descWorkers = prometheus.NewDesc("kiln_workers", "Worker processes whose heartbeat is current.", nil, nil)

	descRunStep       = prometheus.NewDesc("kiln_run_step", "A run's last recorded optimizer step.", []string{"run"}, nil)
	descRunTotal      = prometheus.NewDesc("kiln_run_total_steps", "A run's length in optimizer steps.", []string{"run"}, nil)
	descRunTokens     = prometheus.NewDesc("kiln_run_tokens", "Target tokens a run has trained on.", []string{"run"}, nil)
	descRunLoss       = prometheus.NewDesc("kiln_run_loss", "A run's last logged training loss.", []string{"run"}, nil)
	descRunEvalLoss   = prometheus.NewDesc("kiln_run_eval_loss", "A run's last held-out loss.", []string{"run"}, nil)
	descRunTokPerSec  = prometheus.NewDesc("kiln_run_tokens_per_second", "A run's training throughput over its last logged interval; 0 while its segment trains and has not reported for 5 minutes (a hang).", []string{"run"}, nil)
	descRunReported   = prometheus.NewDesc("kiln_run_last_report_timestamp_seconds", "When a run last reported (Unix time): its last logged step, or its running segment's start.", []string{"run"}, nil)
	descRunCheckpoint = prometheus.NewDesc("kiln_run_checkpoint_step", "The step of a run's newest checkpoint complete in object storage.", []string{"run"}, nil)
	descRunUpload     = prometheus.NewDesc("kiln_run_checkpoint_upload_seconds", "How long a run's last checkpoint took to upload.", []string{"run"}, nil)
	descRunDone       = prometheus.NewDesc("kiln_run_done", "1 once a run reached its end.", []string{"run"}, nil)

	descIngestFiles  = prometheus.NewDesc("kiln_ingest_files", "A store's ingest files, by state (done, failed, stopped at the ingest's limit, running, waiting).", []string{"store", "dataset", "state"}, nil)
	descIngestBytes  = prometheus.NewDesc("kiln_ingest_bytes", "A store's ingest download bytes, by state (total, done).", []string{"store", "dataset", "state"}, nil)
	descIngestTokens = prometheus.NewDesc("kiln_ingest_tokens", "Tokens the done files of a store's ingest appended.", []string{"store", "dataset"}, nil)
	descIngestRate   = prometheus.NewDesc("kiln_ingest_bytes_per_second", "A store's ingest rate over its files so far (bytes, or files where sizes are unknown).", []string{"store", "dataset", "unit"}, nil)
	descAppendLag    = prometheus.NewDesc("kiln_ingest_append_lag", "Shards of a store tokenized and waiting for, or in, their append.", []string{"store"}, nil)
	descScrapeError  = prometheus.NewDesc("kiln_scrape_error", "1 when this scrape could not read Redis (the runs' figures, or the ingest's, which are then left out).", nil, nil)
)

// Describe sends every metric's description.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.queues.Describe(ch)
	for _, d := range []*prometheus.Desc{descWorkers, descRunStep, descRunTotal, descRunTokens, descRunLoss,
		descRunEvalLoss, descRunTokPerSec, descRunReported, descRunCheckpoint, descRunUpload, descRunDone, descIngestFiles, descIngestBytes,
		descIngestTokens, descIngestRate, descAppendLag, descScrapeError} {
		ch <- d
	}
}

// Collect reads the figures from Redis. The runs' figures, which the
// alerts read, come first and from the gpu queue's tasks alone, each part
// within its own bound: the ingest's come from the ingest tasks Redis keeps, a
// week of a large ingest's (seconds at 100,000), and a scrape that ran
// out of time reading them went without the runs' too.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	failed := 0.0
	defer func() { gauge(descScrapeError, failed) }()
	if err := m.collectRuns(gauge); err != nil {
		m.log.Warn("metrics: read the runs", zap.Error(err))
		failed = 1
	}
	m.queues.Collect(ch)
	if err := m.collectIngest(gauge); err != nil {
		m.log.Warn("metrics: read the ingest's tasks", zap.Error(err))
		failed = 1
	}
}

type gaugeFunc func(d *prometheus.Desc, v float64, labels ...string)

// runsWithin bounds a scrape's read of the runs' figures.
const runsWithin = 10 * time.Second

// collectRuns sends the workers' count and every run's figures.
func (m *Metrics) collectRuns(gauge gaugeFunc) error {
	ctx, cancel := context.WithTimeout(context.Background(), runsWithin)
	defer cancel()
	snap, err := m.q.SnapshotOf(ctx, scheduler.QueueGPU)
	if err != nil {
		return err
	}
	gauge(descWorkers, float64(len(snap.Workers)))
	states, err := scheduler.ReadRunStates(ctx, m.q.Redis())
	if err != nil {
		return err
	}
	now, segments := time.Now(), snap.RunTasks()
	for _, s := range states {
		var running *scheduler.TaskStatus
		if rt, ok := segments[s.Run]; ok && rt.Task.State == "active" {
			running = &rt.Task
		}
		last, silent := s.Silent(running, now)
		gauge(descRunStep, float64(s.Step), s.Run)
		gauge(descRunTotal, float64(s.Total), s.Run)
		gauge(descRunTokens, float64(s.Tokens), s.Run)
		if s.Loss > 0 {
			gauge(descRunLoss, s.Loss, s.Run)
		}
		if s.EvalLoss > 0 {
			gauge(descRunEvalLoss, s.EvalLoss, s.Run)
		}
		// A hung step (a stopped process, a GPU that hangs) writes
		// nothing, and the rate of the last logged interval would stand
		// for as long: an alert on the rate could never see it. A last
		// segment whose training is over and that waits for its uploads
		// writes nothing either (minutes on a slow store): not a hang
		// of its training, which the rate is of.
		rate := s.TokPerS
		if silent {
			rate = 0
		}
		gauge(descRunTokPerSec, rate, s.Run)
		if !last.IsZero() {
			gauge(descRunReported, float64(last.Unix()), s.Run)
		}
		gauge(descRunCheckpoint, float64(s.Checkpoint), s.Run)
		if s.UploadSeconds > 0 {
			gauge(descRunUpload, s.UploadSeconds, s.Run)
		}
		done := 0.0
		if s.Done {
			done = 1
		}
		gauge(descRunDone, done, s.Run)
	}
	return nil
}

// collectIngest sends every store's ingest figures and append lag.
func (m *Metrics) collectIngest(gauge gaugeFunc) error {
	within := m.IngestWithin
	if within <= 0 {
		within = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	snap, err := m.q.SnapshotOf(ctx, scheduler.IngestQueues...)
	if err != nil {
		return err
	}
	datasets := snap.Datasets()
	lag := map[string]int{}
	for _, d := range datasets {
		lag[d.Store] = 0
		dataset := strings.Join(d.Datasets, ",") // several where --store sent several datasets into one store
		for state, n := range map[string]int{"done": d.Done, "failed": d.Failed, "stopped": d.Stopped, "running": d.Running, "waiting": d.Waiting} {
			gauge(descIngestFiles, float64(n), d.Store, dataset, state)
		}
		gauge(descIngestBytes, float64(d.Bytes), d.Store, dataset, "total")
		gauge(descIngestBytes, float64(d.DoneBytes), d.Store, dataset, "done")
		gauge(descIngestTokens, float64(d.Tokens), d.Store, dataset)
		unit := "bytes"
		if !d.SizesKnown {
			unit = "files"
		}
		gauge(descIngestRate, d.Rate, d.Store, dataset, unit)
	}
	for _, t := range snap.Tasks {
		if t.Kind != scheduler.KindIngestAppend {
			continue
		}
		switch t.State {
		case "pending", "active", "retry", "scheduled":
			if a, err := scheduler.Decode[scheduler.IngestAppend](t.Payload); err == nil {
				lag[a.Store]++
			}
		}
	}
	for store, n := range lag {
		gauge(descAppendLag, float64(n), store)
	}
	return nil
}

// ServeMetrics listens on addr and serves /metrics (kiln's figures and the
// process's own, Go's runtime included) until ctx ends. It returns once
// the listener is open, with its address (addr may name port 0).
func ServeMetrics(ctx context.Context, addr string, m *Metrics) (string, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics endpoint %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("metrics endpoint stopped", zap.Error(err))
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr().String(), nil
}
